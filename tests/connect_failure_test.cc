// A trainer stream fails at once on what retrying cannot fix, naming the
// cause, against a real rollpackd (issue 43): a TLS mismatch either way, a
// CA that did not sign the server's certificate, a token the server does not
// know; an address nothing listens on or that does not resolve after its
// connect_grace, not after its 60 s resume_timeout. A server started 2 s
// after the stream is still waited for, and an address this process reached
// before is a restart, retried for the whole resume_timeout.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/connect_failure.h"
#include "client/cpp/trainer_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/daemon_process.h"
#include "testing/test_certificates.h"

#ifndef ROLLPACKD_PATH
#error "ROLLPACKD_PATH must name the rollpackd binary"
#endif

namespace rollpack {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "trainer-token-0123456789";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A port nothing listens on (bound, then closed).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

struct Ended {
  absl::Status status;
  absl::Duration took;
};

class ConnectFailureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/rollpack_connect_XXXXXX";
    dir_ = new std::string(mkdtemp(tmpl));
    ASSERT_TRUE(MakeTestCertificates(*dir_, {"ca", "rogue"}, {{"server", "localhost", "ca"}}).ok());
    std::ofstream(*dir_ + "/tokens") << "trainer " << kToken << "\n";
    std::filesystem::permissions(*dir_ + "/tokens", std::filesystem::perms::owner_read |
                                                        std::filesystem::perms::owner_write);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  std::unique_ptr<DaemonProcess> Start(std::vector<std::string> args) {
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(
        ROLLPACKD_PATH, std::move(args), absl::StrCat(*dir_, "/port", ++daemons_));
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *std::move(d) : nullptr;
  }
  std::unique_ptr<DaemonProcess> StartTls() {
    return Start({"--tls-cert=" + *dir_ + "/server.crt", "--tls-key=" + *dir_ + "/server.key"});
  }

  // Reads step "s" rank 0 of `target` until the stream ends.
  Ended Read(const std::string& target, ClientOptions connection,
             TrainerStreamOptions options = {}) {
    options.target = target;
    options.tls = connection.tls || !connection.tls_root_certs_pem.empty();
    options.auth_token = connection.auth_token;
    const absl::Time start = absl::Now();
    TrainerStream stream(MakeChannel(target, connection), "s", v1::RankCoords(), options);
    absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
    return {next.status(), absl::Now() - start};
  }

  static std::string* dir_;
  int daemons_ = 0;
};

std::string* ConnectFailureTest::dir_ = nullptr;

// Only the client's own connection attempt is classified: a member that
// answers UNAVAILABLE because its etcd or a peer refused it was reached,
// and its answer is retried like any other.
TEST(ClassifyFailureTest, AServersAnswerQuotingAConnectFailureIsRetryable) {
  EXPECT_EQ(ClassifyFailure(absl::UnavailableError(
                "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: "
                "Failed to connect to remote host: Connection refused")),
            FailureKind::kUnreachable);
  EXPECT_EQ(ClassifyFailure(absl::UnavailableError(
                "DNS resolution failed for no-such-host.invalid:1: Domain name not found")),
            FailureKind::kUnreachable);
  EXPECT_EQ(ClassifyFailure(absl::UnavailableError(
                "etcd (http://127.0.0.1:2379): failed to connect to all addresses; last error: "
                "UNKNOWN: ipv4:127.0.0.1:2379: Failed to connect to remote host: Connection "
                "refused")),
            FailureKind::kRetryable);
  EXPECT_EQ(ClassifyFailure(absl::UnavailableError(
                "member 10.0.0.2:50051: Ssl handshake failed: SSL_ERROR_SSL")),
            FailureKind::kRetryable);
}

TEST_F(ConnectFailureTest, RefusedPortEndsAfterTheGraceNotTheResumeTimeout) {
  const std::string target = absl::StrCat("127.0.0.1:", FreePort());
  TrainerStreamOptions options;
  options.connect_grace = absl::Seconds(1);
  const Ended e = Read(target, {}, options);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kUnavailable) << e.status;
  EXPECT_THAT(e.status.message(), HasSubstr(absl::StrCat("nothing accepts connections at ", target,
                                                         " (connection refused) for 1")));
  EXPECT_THAT(e.status.message(), HasSubstr("--listen"));
  EXPECT_GE(e.took, absl::Seconds(1));
  EXPECT_LT(e.took, absl::Seconds(5)) << "resume_timeout is 60 s";
}

TEST_F(ConnectFailureTest, UnknownHostEndsAfterTheGrace) {
  TrainerStreamOptions options;
  options.connect_grace = absl::Seconds(1);
  const Ended e = Read("no-such-host.invalid:50051", {}, options);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kUnavailable) << e.status;
  EXPECT_THAT(e.status.message(),
              HasSubstr("the host of no-such-host.invalid:50051 does not resolve"));
  EXPECT_LT(e.took, absl::Seconds(5));
}

TEST_F(ConnectFailureTest, TlsToAPlaintextServerEndsAtOnce) {
  std::unique_ptr<DaemonProcess> d = Start({});
  ASSERT_NE(d, nullptr);
  ClientOptions tls;
  tls.tls_root_certs_pem = ReadFile(*dir_ + "/ca.crt");
  const Ended e = Read(d->address(), tls);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kUnavailable) << e.status;
  EXPECT_THAT(e.status.message(),
              HasSubstr(absl::StrCat("TLS handshake with ", d->address(), " failed")));
  EXPECT_THAT(e.status.message(), HasSubstr("does not speak TLS (rollpackd without --tls-cert)"));
  EXPECT_THAT(e.status.message(), HasSubstr("retrying cannot fix this"));
  EXPECT_LT(e.took, absl::Seconds(3)) << "connect_grace is 10 s";
}

TEST_F(ConnectFailureTest, PlaintextToATlsServerEndsAtOnce) {
  std::unique_ptr<DaemonProcess> d = StartTls();
  ASSERT_NE(d, nullptr);
  const Ended e = Read(d->address(), {});
  EXPECT_EQ(e.status.code(), absl::StatusCode::kUnavailable) << e.status;
  EXPECT_THAT(e.status.message(),
              HasSubstr(absl::StrCat(d->address(),
                                     " speaks TLS (rollpackd --tls-cert) and this "
                                     "client does not")));
  EXPECT_THAT(e.status.message(), HasSubstr("retrying cannot fix this"));
  EXPECT_LT(e.took, absl::Seconds(5)) << "connect_grace is 10 s";
}

TEST_F(ConnectFailureTest, ACaThatDidNotSignTheServerEndsAtOnce) {
  std::unique_ptr<DaemonProcess> d = StartTls();
  ASSERT_NE(d, nullptr);
  ClientOptions rogue;
  rogue.tls_root_certs_pem = ReadFile(*dir_ + "/rogue.crt");
  const Ended e = Read(d->address(), rogue);
  EXPECT_THAT(e.status.message(), HasSubstr("certificate is not signed by the CA"));
  EXPECT_THAT(e.status.message(), HasSubstr("retrying cannot fix this"));
  EXPECT_LT(e.took, absl::Seconds(3));

  ClientOptions misnamed;
  misnamed.tls_root_certs_pem = ReadFile(*dir_ + "/ca.crt");
  misnamed.tls_server_name = "other.example";
  const Ended n = Read(d->address(), misnamed);
  EXPECT_THAT(n.status.message(), HasSubstr("does not name the host dialled"));
  EXPECT_LT(n.took, absl::Seconds(3));
}

TEST_F(ConnectFailureTest, AnUnknownTokenEndsAtOnce) {
  std::unique_ptr<DaemonProcess> d = Start({"--auth-tokens=" + *dir_ + "/tokens"});
  ASSERT_NE(d, nullptr);
  ClientOptions wrong;
  wrong.auth_token = "not-a-token-of-the-server";
  const Ended e = Read(d->address(), wrong);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kUnauthenticated) << e.status;
  EXPECT_THAT(e.status.message(),
              HasSubstr(absl::StrCat("rollpackd at ", d->address(), " refused the credentials")));
  EXPECT_THAT(e.status.message(), HasSubstr("--auth-tokens"));
  EXPECT_LT(e.took, absl::Seconds(3));
}

TEST_F(ConnectFailureTest, AServerStartedTwoSecondsLaterIsWaitedFor) {
  const int port = FreePort();
  Ended e;
  std::thread reader([&] { e = Read(absl::StrCat("127.0.0.1:", port), {}); });
  // Started from this thread: a child dies with the thread that spawned it.
  absl::SleepFor(absl::Seconds(2));
  std::unique_ptr<DaemonProcess> d = Start({absl::StrCat("--listen=127.0.0.1:", port)});
  reader.join();
  ASSERT_NE(d, nullptr);
  // The server answered: the step does not exist there.
  EXPECT_EQ(e.status.code(), absl::StatusCode::kNotFound) << e.status;
  EXPECT_GE(e.took, absl::Seconds(2));
  EXPECT_LT(e.took, absl::Seconds(9));
}

TEST_F(ConnectFailureTest, AnAddressReachedBeforeIsARestartRetriedForResumeTimeout) {
  const std::string target = absl::StrCat("127.0.0.1:", FreePort());
  NoteReached(target);
  TrainerStreamOptions options;
  options.connect_grace = absl::Milliseconds(500);
  options.resume_timeout = absl::Seconds(2);
  const Ended e = Read(target, {}, options);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kUnavailable) << e.status;
  EXPECT_THAT(e.status.message(), HasSubstr("resume_timeout 2s"));
  EXPECT_GE(e.took, absl::Seconds(2));
}

}  // namespace
}  // namespace rollpack
