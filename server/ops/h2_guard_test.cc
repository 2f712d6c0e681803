#include "server/ops/h2_guard.h"
#include "server/ops/h2_relay_loop.h"
#include "server/ops/h2_frame_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "absl/synchronization/notification.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace rollpack {
namespace {

// A gRPC server that listens on nothing, fronted by a guard.
class H2GuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    absl::StatusOr<std::unique_ptr<H2Guard>> guard = H2Guard::Listen("127.0.0.1:0", Options());
    ASSERT_TRUE(guard.ok()) << guard.status();
    guard_ = *std::move(guard);
    server_ = Build();
    ASSERT_NE(server_, nullptr);
    guard_->Start(server_.get());
  }

  virtual H2GuardOptions Options() const { return {}; }

  // Health and a generic service (so that gRPC polls), on no port.
  std::unique_ptr<grpc::Server> Build() {
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(&generic_);
    return builder.BuildAndStart();
  }

  void TearDown() override {
    if (guard_ != nullptr) guard_->StopAccepting();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
    guard_.reset();
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(guard_->port()); }

  // A raw TCP connection to the guard that never sends or reads a byte.
  int SilentClient() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(guard_->port()));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  }

  bool OpenBecomes(int64_t want, absl::Duration within) const {
    const absl::Time deadline = absl::Now() + within;
    while (guard_->counters()->open.load() != want) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }

  grpc::CallbackGenericService generic_;
  std::unique_ptr<H2Guard> guard_;
  std::unique_ptr<grpc::Server> server_;
};

// grpc.health.v1.Health/Check through a generic stub (the repository
// compiles the health messages, not their stubs).
grpc::Status CheckHealth(grpc::GenericStub& stub, grpc::health::v1::HealthCheckResponse* out) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(grpc::health::v1::HealthCheckRequest().SerializeAsString());
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status result;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status status) {
                   result = std::move(status);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!result.ok()) return result;
  grpc::ProtoBufferReader reader(&response);
  if (!out->ParseFromZeroCopyStream(&reader)) return grpc::Status(grpc::StatusCode::DATA_LOSS, "");
  return result;
}

TEST_F(H2GuardTest, CallsPassThroughTheRelay) {
  grpc::GenericStub stub(grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 20; ++i) {
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status status = CheckHealth(stub, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  EXPECT_EQ(guard_->counters()->open.load(), 1) << "one channel, one relayed connection";
}

TEST_F(H2GuardTest, ARelayEndsWhenGrpcEndsEvenIfItsClientStaysSilent) {
  const int silent = SilentClient();
  ASSERT_TRUE(OpenBecomes(1, absl::Seconds(5)));
  // gRPC closes its side (as on shutdown or --max-connection-idle); the
  // client neither reads nor closes. Before the lingering close the relay,
  // its descriptors and its client's connection slot were held for good.
  guard_->StopAccepting();
  server_->Shutdown(std::chrono::system_clock::now());
  EXPECT_TRUE(OpenBecomes(0, H2RelayLoop::kLinger + absl::Seconds(3)))
      << guard_->counters()->open.load() << " relays still open";
  close(silent);
}

TEST_F(H2GuardTest, WhatIsNotHttp2IsClosedAtItsFirstBytes) {
  const int fd = SilentClient();
  const std::string request = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  char byte;
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  // Whatever gRPC managed to write first (its SETTINGS), a GOAWAY with
  // PROTOCOL_ERROR (so a TLS client sees at once that the port is
  // plaintext, rather than a close it would retry), then the end.
  std::string received;
  ssize_t n;
  while ((n = recv(fd, &byte, 1, 0)) > 0) received.push_back(byte);
  EXPECT_EQ(n, 0) << "closed, not timed out";
  const std::string goaway = ProtocolErrorGoaway(
      "the connection does not start with the HTTP/2 client preface (RFC 9113 3.4)");
  ASSERT_GE(received.size(), goaway.size());
  EXPECT_EQ(received.substr(received.size() - goaway.size()), goaway);
  EXPECT_TRUE(OpenBecomes(0, absl::Seconds(5)));
  EXPECT_EQ(guard_->counters()->closed_not_http2.load(), 1);
  close(fd);
}

class H2GuardCappedTest : public H2GuardTest {
 protected:
  H2GuardOptions Options() const override {
    H2GuardOptions options;
    options.limits.max_connections_per_client = 2;
    return options;
  }
};

TEST_F(H2GuardCappedTest, ConnectionsPerClientHostAreCapped) {
  const int a = SilentClient();
  const int b = SilentClient();
  ASSERT_TRUE(OpenBecomes(2, absl::Seconds(5)));
  const int c = SilentClient();
  char byte;
  timeval timeout{5, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  EXPECT_EQ(recv(c, &byte, 1, 0), 0) << "the third is closed at accept";
  EXPECT_EQ(guard_->counters()->refused_per_client.load(), 1);
  close(a);
  close(b);
  close(c);
  EXPECT_TRUE(OpenBecomes(0, absl::Seconds(5)));
}

TEST(H2GuardListenTest, LocalhostIsEveryAddressItResolvesTo) {
  absl::StatusOr<std::unique_ptr<H2Guard>> guard = H2Guard::Listen("localhost:0", {});
  ASSERT_TRUE(guard.ok()) << guard.status();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*guard)->port()));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  EXPECT_FALSE(H2Guard::Listen("127.0.0.1:x", {}).ok());
}

}  // namespace
}  // namespace rollpack
