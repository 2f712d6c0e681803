// The guard's reset budget end to end, with a client that writes HTTP/2
// frames by hand: cancelling calls after their answers is not rapid reset,
// resetting them before is.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "server/ops/h2_guard.h"

namespace rollpack {
namespace {

constexpr uint8_t kData = 0x0;
constexpr uint8_t kHeaders = 0x1;
constexpr uint8_t kRstStream = 0x3;
constexpr uint8_t kSettings = 0x4;
constexpr uint8_t kPing = 0x6;
constexpr uint8_t kGoaway = 0x7;
constexpr uint8_t kWindowUpdate = 0x8;
constexpr uint8_t kEndStream = 0x1;
constexpr uint8_t kAck = 0x1;
constexpr uint8_t kEndHeaders = 0x4;

std::string Be32(uint32_t v) {
  std::string s;
  for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>(v >> shift);
  return s;
}

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  std::string f{static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n),
                static_cast<char>(type), static_cast<char>(flags)};
  return f + Be32(stream) + payload;
}

// HPACK literal fields without indexing, new names, no Huffman (RFC 7541
// 6.2.2): every string here is under 127 bytes.
std::string Literal(const std::string& name, const std::string& value) {
  return std::string(1, '\0') + static_cast<char>(name.size()) + name +
         static_cast<char>(value.size()) + value;
}

const std::string& HealthCheckHeaders() {
  static const std::string* const block = new std::string(
      Literal(":method", "POST") + Literal(":scheme", "http") +
      Literal(":path", "/grpc.health.v1.Health/Check") + Literal(":authority", "localhost") +
      Literal("content-type", "application/grpc") + Literal("te", "trailers"));
  return *block;
}

// A whole health check: its headers, then an empty request message that ends
// the client's side.
std::string HealthCheck(uint32_t stream) {
  return Frame(kHeaders, kEndHeaders, stream, HealthCheckHeaders()) +
         Frame(kData, kEndStream, stream, std::string(5, '\0'));
}

std::string Cancel(uint32_t stream) { return Frame(kRstStream, 0, stream, Be32(0x8)); }

// One HTTP/2 connection, frames by hand; answers the server's SETTINGS and
// PINGs as any client does.
class RawH2Client {
 public:
  explicit RawH2Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval timeout{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    // The preface, no settings, and a connection window the answers of the
    // whole test fit in.
    Send(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24) + Frame(kSettings, 0, 0, "") +
         Frame(kWindowUpdate, 0, 0, Be32(1u << 30)));
  }
  ~RawH2Client() { close(fd_); }

  bool Send(const std::string& bytes) {
    return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }

  // Reads frames until `answered` streams have ended (the server's
  // END_STREAM); false if the connection ended first (then goaway_error()
  // says whether a GOAWAY came, and which).
  bool ReadAnswers(int answered) {
    while (answered > 0) {
      if (!ReadFrame()) return false;
      if ((type_ == kHeaders || type_ == kData) && (flags_ & kEndStream) != 0) --answered;
    }
    return true;
  }

  // Reads until the connection ends.
  void ReadToEnd() {
    while (ReadFrame()) {
    }
  }

  int64_t goaway_error() const { return goaway_error_; }

 private:
  bool ReadFrame() {
    while (buffered_.size() < 9 ||
           buffered_.size() < 9 + ((uint32_t{static_cast<uint8_t>(buffered_[0])} << 16) |
                                   (uint32_t{static_cast<uint8_t>(buffered_[1])} << 8) |
                                   uint32_t{static_cast<uint8_t>(buffered_[2])})) {
      char chunk[16384];
      const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) return false;
      buffered_.append(chunk, static_cast<size_t>(n));
    }
    const size_t length = (size_t{static_cast<uint8_t>(buffered_[0])} << 16) |
                          (size_t{static_cast<uint8_t>(buffered_[1])} << 8) |
                          size_t{static_cast<uint8_t>(buffered_[2])};
    type_ = static_cast<uint8_t>(buffered_[3]);
    flags_ = static_cast<uint8_t>(buffered_[4]);
    const std::string payload = buffered_.substr(9, length);
    buffered_.erase(0, 9 + length);
    if (type_ == kSettings && (flags_ & kAck) == 0) Send(Frame(kSettings, kAck, 0, ""));
    if (type_ == kPing && (flags_ & kAck) == 0) Send(Frame(kPing, kAck, 0, payload));
    if (type_ == kGoaway && payload.size() >= 8) {
      goaway_error_ = (int64_t{static_cast<uint8_t>(payload[4])} << 24) |
                      (int64_t{static_cast<uint8_t>(payload[5])} << 16) |
                      (int64_t{static_cast<uint8_t>(payload[6])} << 8) |
                      int64_t{static_cast<uint8_t>(payload[7])};
    }
    return true;
  }

  int fd_ = -1;
  std::string buffered_;
  uint8_t type_ = 0;
  uint8_t flags_ = 0;
  int64_t goaway_error_ = -1;
};

class H2GuardResetsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    absl::StatusOr<std::unique_ptr<H2Guard>> guard = H2Guard::Listen("127.0.0.1:0", {});
    ASSERT_TRUE(guard.ok()) << guard.status();
    guard_ = *std::move(guard);
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(&generic_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    guard_->Start(server_.get());
  }

  void TearDown() override {
    if (guard_ != nullptr) guard_->StopAccepting();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
    guard_.reset();
  }

  grpc::CallbackGenericService generic_;
  std::unique_ptr<H2Guard> guard_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(H2GuardResetsTest, CancellingAnsweredCallsIsNotCutOff) {
  // 5,000 calls, each reset by the client once answered: five times the
  // host's budget of 1000 resets, in about a second.
  constexpr int kCalls = 5000;
  constexpr int kBatch = 100;
  RawH2Client client(guard_->port());
  uint32_t stream = 1;
  for (int sent = 0; sent < kCalls; sent += kBatch) {
    std::string calls;
    std::string cancels;
    for (int i = 0; i < kBatch; ++i, stream += 2) {
      calls += HealthCheck(stream);
      cancels += Cancel(stream);
    }
    ASSERT_TRUE(client.Send(calls));
    ASSERT_TRUE(client.ReadAnswers(kBatch)) << "cut off after " << sent << " calls";
    ASSERT_TRUE(client.Send(cancels));
  }
  ASSERT_TRUE(client.Send(HealthCheck(stream)));
  EXPECT_TRUE(client.ReadAnswers(1)) << "the connection still serves";
  EXPECT_EQ(guard_->counters()->streams_reset.load(), kCalls);
  EXPECT_EQ(guard_->counters()->closed_stream_resets.load(), 0);
}

TEST_F(H2GuardResetsTest, RapidResetIsStillCutOff) {
  // The CVE-2023-44487 pattern: each call reset before the server answers.
  RawH2Client client(guard_->port());
  std::string flood;
  for (uint32_t stream = 1; stream < 2 * 3000; stream += 2) {
    flood += Frame(kHeaders, kEndHeaders, stream, HealthCheckHeaders()) + Cancel(stream);
  }
  client.Send(flood);  // may fail part way: the guard closes the connection
  client.ReadToEnd();
  EXPECT_EQ(client.goaway_error(), 0xb) << "GOAWAY(ENHANCE_YOUR_CALM)";
  EXPECT_EQ(guard_->counters()->closed_stream_resets.load(), 1);
}

}  // namespace
}  // namespace rollpack
