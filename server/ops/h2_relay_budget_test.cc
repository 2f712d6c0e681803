// The guard's budget of client buffers (H2GuardOptions::client_buffer_memory):
// relays whose gRPC end is not read fill a buffer each; past the budget the
// others stop reading their clients instead of taking more, and once gRPC
// reads again every byte arrives, in order.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/ops/client_abuse_ledger.h"
#include "server/ops/h2_guard_options.h"
#include "server/ops/h2_relay_loop.h"
#include "server/ops/h2_tls_stream.h"

namespace rollpack {
namespace {

constexpr int kClients = 4;
constexpr size_t kBufferBytes = 4096;

// The client preface, an empty SETTINGS frame, then PING frames (stream 0,
// 8 bytes each) up to about `bytes`: HTTP/2 the watch lets through.
std::string ClientBytes(size_t bytes, int client) {
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  out.append("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
  for (uint64_t i = 0; out.size() < bytes; ++i) {
    out.append("\x00\x00\x08\x06\x00\x00\x00\x00\x00", 9);
    const uint64_t payload = i * kClients + static_cast<uint64_t>(client);
    out.append(reinterpret_cast<const char*>(&payload), sizeof(payload));
  }
  return out;
}

void SetBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK); }

struct StalledRun {
  int64_t held_while_stalled = 0;
  int64_t peak = 0;
  int64_t waits = 0;
  bool all_arrived = true;
};

StalledRun RelayWithGrpcStalled(int64_t client_buffer_memory) {
  H2GuardOptions options;
  options.buffer_bytes = kBufferBytes;
  options.client_buffer_memory = client_buffer_memory;
  ClientAbuseLedger ledger(options.limits);
  H2GuardCounters counters;
  absl::StatusOr<std::unique_ptr<H2RelayLoop>> loop =
      H2RelayLoop::Create(options, &ledger, &counters);
  EXPECT_TRUE(loop.ok()) << loop.status();
  if (!loop.ok()) return {};

  std::vector<int> client_ends, grpc_ends;
  std::vector<std::string> sent;
  for (int i = 0; i < kClients; ++i) {
    int client[2], grpc[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, client), 0);
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, grpc), 0);
    EXPECT_EQ(ledger.AdmitConnection("127.0.0.1", absl::Now()),
              ClientAbuseLedger::Admission::kAdmitted);
    (*loop)->Add(client[0], grpc[0], RelayPeer{"ipv4:127.0.0.1:1", "127.0.0.1"});
    SetBlocking(client[1]);
    SetBlocking(grpc[1]);
    client_ends.push_back(client[1]);
    grpc_ends.push_back(grpc[1]);
    // Several times what the two socket pairs' kernel buffers hold.
    sent.push_back(ClientBytes(size_t{4} << 20, i));
  }
  std::vector<std::thread> writers;
  for (int i = 0; i < kClients; ++i) {
    writers.emplace_back([fd = client_ends[i], &bytes = sent[i]] {
      for (size_t at = 0; at < bytes.size();) {
        const ssize_t n = write(fd, bytes.data() + at, bytes.size() - at);
        if (n <= 0) return;
        at += static_cast<size_t>(n);
      }
    });
  }
  // gRPC reads nothing yet: every relay's socket pair fills, then its buffer.
  StalledRun run;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  const int64_t all_held = int64_t{kClients} * kBufferBytes;
  const int64_t expect_held =
      client_buffer_memory > 0 ? std::min(client_buffer_memory, all_held) : all_held;
  while (counters.client_buffer_bytes.load() < expect_held && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::SleepFor(absl::Milliseconds(200));  // time for more to be taken, were it allowed
  run.held_while_stalled = counters.client_buffer_bytes.load();

  // gRPC reads again: everything arrives.
  std::vector<std::string> received(kClients);
  std::vector<std::thread> readers;
  for (int i = 0; i < kClients; ++i) {
    readers.emplace_back([fd = grpc_ends[i], want = sent[i].size(), &got = received[i]] {
      std::vector<char> chunk(1 << 16);
      while (got.size() < want) {
        const ssize_t n = read(fd, chunk.data(), chunk.size());
        if (n <= 0) return;
        got.append(chunk.data(), static_cast<size_t>(n));
      }
    });
  }
  for (std::thread& t : readers) t.join();
  for (std::thread& t : writers) t.join();
  for (int i = 0; i < kClients; ++i) {
    if (received[i] != sent[i]) {
      ADD_FAILURE() << "client " << i << ": " << received[i].size() << " of " << sent[i].size()
                    << " bytes arrived (or out of order)";
      run.all_arrived = false;
    }
  }
  run.peak = counters.client_buffer_peak.load();
  run.waits = counters.client_buffer_waits.load();
  for (int fd : client_ends) close(fd);
  for (int fd : grpc_ends) close(fd);
  loop->reset();
  EXPECT_EQ(counters.client_buffer_bytes.load(), 0) << "buffers given back when relays end";
  return run;
}

TEST(H2RelayBudgetTest, ClientBuffersStayWithinTheBudgetAndEveryByteArrives) {
  const StalledRun bounded = RelayWithGrpcStalled(2 * kBufferBytes);
  EXPECT_TRUE(bounded.all_arrived);
  EXPECT_EQ(bounded.held_while_stalled, 2 * int64_t{kBufferBytes});
  EXPECT_LE(bounded.peak, 2 * int64_t{kBufferBytes});
  EXPECT_GT(bounded.waits, 0) << "two relays waited for a buffer";
}

TEST(H2RelayBudgetTest, WithoutABudgetEveryStalledRelayHoldsABuffer) {
  // What the budget prevents: the same load takes a buffer per connection.
  const StalledRun unbounded = RelayWithGrpcStalled(0);
  EXPECT_TRUE(unbounded.all_arrived);
  EXPECT_EQ(unbounded.held_while_stalled, int64_t{kClients} * kBufferBytes);
  EXPECT_EQ(unbounded.waits, 0);
}

}  // namespace
}  // namespace rollpack
