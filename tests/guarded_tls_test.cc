// A TLS port without client certificates behind the HTTP/2 guard, which ends
// TLS itself (server/ops/h2_tls_context.h): gRPC clients are served over TLS,
// and what the guard bounds on a plaintext port is bounded here too: rapid
// reset, calls without a token, and handshakes that never finish.
//
// GUARDED_TLS_TEST_H2_GUARD=false runs the same tests against gRPC's own TLS
// port (--h2-guard=false, what every TLS port was before): each of them fails.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/ops/metrics/scrape_registry.h"
#include "server/server.h"
#include "testing/exposition.h"
#include "testing/ops_fixtures.h"
#include "testing/test_certificates.h"

namespace rollpack {
namespace {

constexpr char kGetPool[] = "/rollpack.v1.Rollouts/GetPool";

H2GuardMode ModeUnderTest() {
  const char* mode = std::getenv("GUARDED_TLS_TEST_H2_GUARD");
  return mode != nullptr && std::string(mode) == "false" ? H2GuardMode::kOff : H2GuardMode::kOn;
}

// A unary call through the generic stub: its status.
grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                  const std::string& body, const std::string& token = "") {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

std::string GetPoolOfNone() {
  v1::GetPoolRequest request;
  request.set_pool("none");
  return request.SerializeAsString();
}

// ------------------------------------------------ a raw HTTP/2 client on TLS

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  const uint32_t length = static_cast<uint32_t>(payload.size());
  std::string frame = {static_cast<char>(length >> 16), static_cast<char>(length >> 8),
                       static_cast<char>(length),       static_cast<char>(type),
                       static_cast<char>(flags),        static_cast<char>(stream >> 24 & 0x7f),
                       static_cast<char>(stream >> 16), static_cast<char>(stream >> 8),
                       static_cast<char>(stream)};
  return frame + payload;
}

// HPACK (RFC 7541): a literal without indexing, of a static table name or a new one.
std::string Literal(uint8_t name_index, const std::string& name, const std::string& value) {
  std::string out(1, static_cast<char>(name_index < 15 ? name_index : 15));
  if (name_index >= 15) out.push_back(static_cast<char>(name_index - 15));
  if (name_index == 0) out += std::string(1, static_cast<char>(name.size())) + name;
  return out + std::string(1, static_cast<char>(value.size())) + value;
}

// The headers of a GetPool call: POST, https, :path, :authority, content-type, te.
std::string GetPoolHeaderBlock() {
  return "\x83\x87" + Literal(4, "", kGetPool) + Literal(1, "", "127.0.0.1") +
         Literal(31, "", "application/grpc") + Literal(0, "te", "trailers");
}

// What a stock gRPC client will not send: HTTP/2 frames of our own, over TLS
// (ALPN h2; the server's certificate is not checked).
class RawTlsClient {
 public:
  ~RawTlsClient() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
    if (fd_ >= 0) close(fd_);
  }

  // Connected and through the handshake.
  bool Connect(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    timeval timeout{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return false;
    ctx_ = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_alpn_protos(ctx_, reinterpret_cast<const unsigned char*>("\x02h2"), 3);
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    ERR_clear_error();
    return SSL_connect(ssl_) == 1;
  }

  bool Write(const std::string& bytes) {
    size_t written = 0;
    while (written < bytes.size()) {
      const int n = SSL_write(ssl_, bytes.data() + written, static_cast<int>(bytes.size() - written));
      if (n <= 0) return false;
      written += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads the server's frames until a GOAWAY: its error code; -1 when the
  // connection ended or stayed silent for 5 s without one.
  int64_t ErrorOfGoaway() {
    for (;;) {
      std::string header(9, '\0');
      if (!ReadExactly(header)) return -1;
      const auto byte = [&](int i) { return static_cast<uint8_t>(header[i]); };
      std::string payload((byte(0) << 16) | (byte(1) << 8) | byte(2), '\0');
      if (!ReadExactly(payload)) return -1;
      if (byte(3) == 7 && payload.size() >= 8) {
        const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
        return (int64_t{p[4]} << 24) | (p[5] << 16) | (p[6] << 8) | p[7];
      }
    }
  }

 private:
  bool ReadExactly(std::string& out) {
    size_t have = 0;
    while (have < out.size()) {
      const int n = SSL_read(ssl_, out.data() + have, static_cast<int>(out.size() - have));
      if (n <= 0) return false;
      have += static_cast<size_t>(n);
    }
    return true;
  }

  int fd_ = -1;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
};

// ------------------------------------------------------------------ fixture

class GuardedTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The raw client writes with OpenSSL (write(2)) to connections the guard closes.
    signal(SIGPIPE, SIG_IGN);
    ASSERT_TRUE(MakeTestCertificates(dir_.file(""), {"ca", "other-ca"},
                                     {{"server", "localhost", "ca"},
                                      {"other-server", "localhost", "other-ca"}})
                    .ok());
  }

  // A server on 127.0.0.1 presenting `cert` (a name given to
  // MakeTestCertificates), no client CA, the guard as under test.
  void Start(ServerOptions options, const std::string& cert = "server") {
    options.tls_cert = dir_.file(cert + ".crt");
    options.tls_key = dir_.file(cert + ".key");
    options.h2_guard = ModeUnderTest();
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }

  // A TLS channel trusting `ca` only.
  std::shared_ptr<grpc::Channel> Channel(const std::string& ca = "ca") const {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(dir_.file(ca + ".crt"));
    return grpc::CreateChannel(server_->address(), grpc::SslCredentials(ssl));
  }

  double Metric(const std::string& series) {
    return ParseExposition(server_->metrics_registry().SerializeText())[series];
  }

  double Closed(const std::string& reason) {
    return Metric(absl::StrCat("rollpack_h2_guard_closed_connections_total{reason=\"", reason,
                               "\"}"));
  }

  TempDir dir_;
  std::unique_ptr<RollpackServer> server_;
};

TEST_F(GuardedTlsTest, GrpcClientsAreServedThroughTheGuard) {
  Start(ServerOptions());
  std::shared_ptr<grpc::Channel> channel = Channel();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(Call(channel, kGetPool, GetPoolOfNone()).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(Metric("rollpack_h2_guard_connections"), 1) << "one channel, relayed by the guard";
  // The certificate is checked by the client as before.
  EXPECT_EQ(Call(Channel("other-ca"), kGetPool, GetPoolOfNone()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(GuardedTlsTest, RapidResetOverTlsGetsGoawayAndCoolsTheHostDown) {
  ServerOptions options;
  options.h2_guard_options.limits.reset_budget = 100;
  options.h2_guard_options.limits.cooldown = absl::Seconds(2);
  Start(options);
  RawTlsClient attacker;
  ASSERT_TRUE(attacker.Connect(server_->port()));
  std::string flood = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + Frame(4, 0, 0, "");
  const std::string block = GetPoolHeaderBlock();
  for (uint32_t stream = 1; stream < 1000; stream += 2) {
    flood += Frame(1, 0x4, stream, block) + Frame(3, 0, stream, std::string("\0\0\0\x8", 4));
  }
  ASSERT_TRUE(attacker.Write(flood));
  EXPECT_EQ(attacker.ErrorOfGoaway(), 0xb) << "GOAWAY(ENHANCE_YOUR_CALM)";
  EXPECT_EQ(Closed("stream_resets"), 1);
  // The host (127.0.0.1) is refused while it cools down, then served again.
  RawTlsClient again;
  EXPECT_FALSE(again.Connect(server_->port())) << "closed at accept";
  EXPECT_GE(Metric("rollpack_h2_guard_refused_connections_total{reason=\"cooling_down\"}"), 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE;
  while (code != grpc::StatusCode::NOT_FOUND && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
    code = Call(Channel(), kGetPool, GetPoolOfNone()).error_code();
  }
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND) << "served again after the cool-down";
}

TEST_F(GuardedTlsTest, CallsWithoutATokenAreBoundedByTheGuard) {
  ServerOptions options;
  options.auth_tokens_file = dir_.Write("tokens", absl::StrCat("trainer ", kTrainer, "\n"));
  Start(options);
  std::shared_ptr<grpc::Channel> channel = Channel();
  EXPECT_EQ(Call(channel, kGetPool, GetPoolOfNone(), kTrainer).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Call(channel, kGetPool, GetPoolOfNone()).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // 8 MB without a token: the guard closes the connection once 1 MiB of it
  // came (gRPC alone would read it whole before its handler refuses it).
  EXPECT_EQ(Call(Channel(), kGetPool, std::string(8 << 20, 'x')).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Closed("unauthenticated"), 1);
}

TEST_F(GuardedTlsTest, AStalledHandshakeIsClosedWithinItsBound) {
  ServerOptions options;
  options.h2_guard_options.tls_handshake_timeout = absl::Seconds(1);
  Start(options);
  // One connection sends nothing, one the first bytes of a ClientHello.
  const auto stalled = [&](const std::string& first_bytes) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    timeval timeout{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (!first_bytes.empty()) send(fd, first_bytes.data(), first_bytes.size(), MSG_NOSIGNAL);
    return fd;
  };
  const absl::Time start = absl::Now();
  const int silent = stalled("");
  const int partial = stalled(std::string("\x16\x03\x01\x02\x00\x01", 6));
  for (int fd : {silent, partial}) {
    char byte;
    ssize_t n;
    while ((n = recv(fd, &byte, 1, 0)) > 0) {
    }
    EXPECT_EQ(n, 0) << "closed by the server, not timed out: " << std::strerror(errno);
    close(fd);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_EQ(Closed("tls_handshake"), 2);
  EXPECT_EQ(Call(Channel(), kGetPool, GetPoolOfNone()).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(GuardedTlsTest, NewConnectionsUseAReplacedCertificate) {
  // The server's files are copies, replaced as an operator would (rename).
  const auto install = [&](const std::string& name) {
    for (const char* ext : {".crt", ".key"}) {
      const std::string text = ReadFile(dir_.file(name + ext));
      dir_.Write(absl::StrCat("next", ext), text);
      ASSERT_EQ(std::rename(dir_.file(absl::StrCat("next", ext)).c_str(),
                            dir_.file(absl::StrCat("live", ext)).c_str()),
                0);
    }
  };
  install("server");
  ServerOptions options;
  options.tls_refresh = absl::Seconds(1);
  Start(options, "live");
  std::shared_ptr<grpc::Channel> old_channel = Channel("ca");
  EXPECT_EQ(Call(old_channel, kGetPool, GetPoolOfNone()).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Metric("rollpack_h2_guard_connections"), 1) << "relayed by the guard";
  EXPECT_EQ(Call(Channel("other-ca"), kGetPool, GetPoolOfNone()).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  install("other-server");
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE;
  while (code != grpc::StatusCode::NOT_FOUND && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
    code = Call(Channel("other-ca"), kGetPool, GetPoolOfNone()).error_code();
  }
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND) << "new handshakes present the new certificate";
  EXPECT_EQ(Call(Channel("ca"), kGetPool, GetPoolOfNone()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // The connection made before keeps its certificate.
  EXPECT_EQ(Call(old_channel, kGetPool, GetPoolOfNone()).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace rollpack
