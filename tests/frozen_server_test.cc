// PutSamples lends the samples' bytes to gRPC and returns only once gRPC has
// let go of them (proto/wire/slice_gather_stream.h). A server that stops
// reading mid-call (its process frozen, its kernel still holding the
// connection) must not hold the producer forever: the client's keepalive
// closes the connection in bounded time and the call fails.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "testing/synthetic_rollouts.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace rollpack {
namespace {

// Forwards TCP connections to 127.0.0.1:target_port until Freeze(); from
// then on it neither reads nor forwards anything, but keeps the sockets open.
class FreezableProxy {
 public:
  explicit FreezableProxy(int target_port) : target_port_(target_port) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(listener_, 16);
    socklen_t length = sizeof(addr);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &length);
    port_ = ntohs(addr.sin_port);
    threads_.emplace_back([this] { Accept(); });
  }
  ~FreezableProxy() {
    stopping_ = true;
    for (std::thread& t : threads_) t.join();
    for (int fd : sockets_) close(fd);
    close(listener_);
  }

  int port() const { return port_; }
  void Freeze() { frozen_ = true; }
  int64_t forwarded() const { return forwarded_; }

 private:
  void Accept() {
    while (!stopping_) {
      pollfd ready{listener_, POLLIN, 0};
      if (poll(&ready, 1, 20) <= 0) continue;
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(client);
        close(server);
        continue;
      }
      sockets_.push_back(client);
      sockets_.push_back(server);
      pumps_.emplace_back([this, client, server] { Pump(client, server); });
      pumps_.emplace_back([this, client, server] { Pump(server, client); });
    }
    for (std::thread& t : pumps_) t.join();
  }

  void Pump(int from, int to) {
    std::vector<char> buffer(1 << 16);
    while (!stopping_) {
      if (frozen_) {
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      pollfd ready{from, POLLIN, 0};
      if (poll(&ready, 1, 20) <= 0) continue;
      const ssize_t n = read(from, buffer.data(), buffer.size());
      if (n <= 0) return;
      for (ssize_t sent = 0; sent < n;) {
        const ssize_t w = write(to, buffer.data() + sent, n - sent);
        if (w <= 0) return;
        sent += w;
      }
      forwarded_ += n;
    }
  }

  const int target_port_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> frozen_{false};
  std::atomic<int64_t> forwarded_{0};
  std::vector<int> sockets_;        // the Accept thread's until it ends
  std::vector<std::thread> pumps_;  // the Accept thread's
  std::vector<std::thread> threads_;
};

TEST(FrozenServerTest, PutSamplesFailsInBoundedTimeWhenTheServerStopsReading) {
  ServerOptions server_options;
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  {
    auto proxy_owner = std::make_unique<FreezableProxy>(port);
    FreezableProxy& proxy = *proxy_owner;
    ClientOptions options;
    options.put_streams = 1;
    options.keepalive_time = absl::Seconds(1);
    options.keepalive_timeout = absl::Seconds(1);
    options.deadline = absl::Seconds(120);
    RollpackClient client("127.0.0.1:" + std::to_string(proxy.port()), options);
    v1::ModelSpec model;
    model.set_num_layers(48);
    model.set_num_experts(128);
    model.set_topk(8);
    ASSERT_TRUE(client.RegisterModel("p", model).ok());
    SyntheticOptions synth;
    synth.num_samples = 64;
    synth.median_length = 16000;
    synth.min_length = 12000;
    synth.max_length = 20000;  // ~6 MB of routing each, ~400 MB in all
    const std::vector<v1::Sample> samples = MakeSyntheticRollouts(model, synth);
    const int64_t before = proxy.forwarded();
    std::atomic<bool> returned{false};
    absl::Status status;
    std::thread producer([&] {
      status = client.PutSamples("p", samples).status();
      returned = true;
    });
    // Freeze once the call is well under way, before it can finish.
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (proxy.forwarded() - before < (int64_t{24} << 20) && !returned &&
           absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    proxy.Freeze();
    const absl::Time frozen_at = absl::Now();
    while (!returned && absl::Now() - frozen_at < absl::Seconds(60)) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    const bool returned_in_time = returned;
    const absl::Duration waited = absl::Now() - frozen_at;
    EXPECT_TRUE(returned_in_time) << "PutSamples still blocked " << waited << " after the freeze";
    if (returned_in_time) {
      EXPECT_FALSE(status.ok()) << "the call finished before the freeze; send more";
      EXPECT_LT(waited, absl::Seconds(30));
    }
    // Closing the proxy's sockets ends a call still blocked, so the test ends.
    proxy_owner.reset();
    producer.join();
  }
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace rollpack
