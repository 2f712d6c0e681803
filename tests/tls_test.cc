// TLS and mutual TLS with certificates made by openssl at test time.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "testing/synthetic_rollouts.h"
#include "client/cpp/trainer_stream.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "testing/exposition.h"
#include "server/ops/auth.h"
#include "server/ops/metrics/scrape_registry.h"
#include "server/server.h"
#include "testing/ops_fixtures.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------- TLS

// CA, server cert for 127.0.0.1/localhost, a client cert from the CA, and a
// client cert from another CA, made with openssl.
class Certs {
 public:
  explicit Certs(const TempDir& dir) : dir_(dir) {
    const std::string d = dir.file("");
    const std::string script =
        "set -e; cd '" + d + "'; "
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=rollpack-test-ca "
        "  -keyout ca.key -out ca.crt 2>/dev/null; "
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=rogue-ca "
        "  -keyout rogue.key -out rogue.crt 2>/dev/null; "
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext; "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key "
        "  -out server.csr 2>/dev/null; "
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 "
        "  -extfile server.ext -out server.crt 2>/dev/null; "
        "for who in client:ca other:rogue; do n=${who%%:*}; ca=${who##*:}; "
        "  openssl req -newkey rsa:2048 -nodes -subj /CN=$n -keyout $n.key -out $n.csr "
        "    2>/dev/null; "
        "  openssl x509 -req -in $n.csr -CA $ca.crt -CAkey $ca.key -CAcreateserial -days 1 "
        "    -out $n.crt 2>/dev/null; done";
    ok_ = std::system(("bash -c \"" + Escape(script) + "\"").c_str()) == 0;
  }
  bool ok() const { return ok_; }
  std::string path(const std::string& name) const { return dir_.file(name); }
  std::string pem(const std::string& name) const { return ReadFile(dir_.file(name)); }

 private:
  static std::string Escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '$' || c == '\\' || c == '`') out += '\\';
      out += c;
    }
    return out;
  }
  const TempDir& dir_;
  bool ok_ = false;
};

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(certs_.ok()) << "openssl failed to make test certs"; }

  std::unique_ptr<RollpackServer> Start(bool mutual) {
    ServerOptions options;
    options.tls_cert = certs_.path("server.crt");
    options.tls_key = certs_.path("server.key");
    if (mutual) options.tls_client_ca = certs_.path("ca.crt");
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  // GetPool of a missing pool: NOT_FOUND proves the call got through.
  static grpc::StatusCode Probe(const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = v1::Rollouts::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetPoolRequest req;
    req.set_pool("none");
    v1::PoolInfo resp;
    return stub->GetPool(&ctx, req, &resp).error_code();
  }

  std::shared_ptr<grpc::Channel> Tls(const RollpackServer& server, const std::string& client) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = certs_.pem("ca.crt");
    if (!client.empty()) {
      ssl.pem_private_key = certs_.pem(client + ".key");
      ssl.pem_cert_chain = certs_.pem(client + ".crt");
    }
    grpc::ChannelArguments args;
    return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server.port()),
                                     grpc::SslCredentials(ssl), args);
  }

  TempDir dir_;
  Certs certs_{dir_};
};

TEST_F(TlsTest, ServerTls) {
  std::unique_ptr<RollpackServer> server = Start(false);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Probe(Tls(*server, "")), grpc::StatusCode::NOT_FOUND);
  // A plaintext client cannot talk to a TLS port.
  EXPECT_EQ(Probe(MakeChannel(server->address())), grpc::StatusCode::UNAVAILABLE);
  // A client that trusts another CA refuses the server.
  grpc::SslCredentialsOptions wrong_ca;
  wrong_ca.pem_root_certs = certs_.pem("rogue.crt");
  EXPECT_EQ(Probe(grpc::CreateChannel(server->address(), grpc::SslCredentials(wrong_ca))),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, MutualTls) {
  std::unique_ptr<RollpackServer> server = Start(true);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Probe(Tls(*server, "client")), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Probe(Tls(*server, "")), grpc::StatusCode::UNAVAILABLE);       // no client cert
  EXPECT_EQ(Probe(Tls(*server, "other")), grpc::StatusCode::UNAVAILABLE);  // another CA's
}

// The C++ client end to end over mutual TLS with tokens: producer pushes,
// trainer plans, admin releases.
TEST_F(TlsTest, CppClientWithTlsAndTokens) {
  ServerOptions options;
  options.tls_cert = certs_.path("server.crt");
  options.tls_key = certs_.path("server.key");
  options.tls_client_ca = certs_.path("ca.crt");
  options.auth_tokens_file = dir_.Write(
      "tokens", std::string("producer ") + kProducer + "\ntrainer " + kTrainer + "\nadmin " +
                    kAdmin + "\n");
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  auto client = [&](const char* token) {
    ClientOptions o;
    o.auth_token = token;
    o.tls_root_certs_pem = certs_.pem("ca.crt");
    o.tls_client_cert_pem = certs_.pem("client.crt");
    o.tls_client_key_pem = certs_.pem("client.key");
    return std::make_unique<RollpackClient>(MakeChannel(address, o), o);
  };
  auto producer = client(kProducer);
  auto trainer = client(kTrainer);
  auto admin = client(kAdmin);
  ASSERT_TRUE(producer->RegisterModel("p", Model()).ok());
  ASSERT_TRUE(producer->PutSamples("p", Samples(8, 512)).ok());
  absl::StatusOr<v1::StepInfo> step = trainer->CreateStep(StepRequest("s", "p", 8, 1, 512));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(trainer->ReleaseStep("s").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(producer->CreateStep(StepRequest("s2", "p", 1, 1, 512)).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<v1::ReleaseStepResponse> released = admin->ReleaseStep("s");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->released_samples(), 8);
  (*server)->Shutdown(absl::Seconds(1));
}

// On a TLS port the token gate (server/ops/token_gate.h) refuses calls from
// their headers, with the handlers' codes and messages: the refusals are
// counted in rollpack_calls_refused_at_start_total, which only the gate
// touches, so a handler-side refusal would fail this test. A refused call's
// request (here 32 MB) is never read whole.
TEST_F(TlsTest, TokensAreCheckedFromTheHeadersBeforeAnyMessage) {
  ServerOptions options;
  options.tls_cert = certs_.path("server.crt");
  options.tls_key = certs_.path("server.key");
  options.auth_tokens_file =
      dir_.Write("tokens", std::string("producer ") + kProducer + "\ntrainer " + kTrainer + "\n");
  // gRPC's own TLS port: the gate runs there. Behind the HTTP/2 guard (the
  // default for such a port) the guard's token check stands in
  // (tests/guarded_tls_test.cc).
  options.h2_guard = H2GuardMode::kOff;
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::shared_ptr<grpc::Channel> channel = Tls(**server, "");
  auto call = [&](const std::string& method, const std::string& token, const std::string& body) {
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    grpc::Slice slice(body);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    done.WaitForNotification();
    return status;
  };
  auto refused = [&](const std::string& code) {
    return ParseExposition((*server)->metrics_registry().SerializeText())
        [absl::StrCat("rollpack_calls_refused_at_start_total{code=\"", code, "\"}")];
  };
  v1::GetPoolRequest get_pool;
  get_pool.set_pool("none");
  const std::string small = get_pool.SerializeAsString();
  const std::string large(32 << 20, 'x');

  grpc::Status no_token = call("/rollpack.v1.Rollouts/GetPool", "", large);
  EXPECT_EQ(no_token.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(no_token.error_message(), HasSubstr("missing `authorization: Bearer <token>`"));
  grpc::Status unknown = call("/rollpack.v1.Rollouts/GetPool", "not-a-token-of-this-server", large);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(unknown.error_message(), "unknown token");
  EXPECT_EQ(refused("UNAUTHENTICATED"), 2);

  grpc::Status denied = call("/rollpack.v1.Scheduler/ReleaseStep", kProducer, large);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(denied.error_message(), HasSubstr("role producer may not call"));
  EXPECT_EQ(refused("PERMISSION_DENIED"), 1);

  // Through the gate: the handler answers.
  EXPECT_EQ(call("/rollpack.v1.Rollouts/GetPool", kProducer, small).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // A method rollpackd does not serve: a known token gets gRPC's
  // UNIMPLEMENTED, no token the gate's UNAUTHENTICATED.
  EXPECT_EQ(call("/rollpack.v1.Nope/Nothing", kTrainer, small).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(call("/rollpack.v1.Nope/Nothing", "", small).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(refused("UNAUTHENTICATED"), 3);
  // Health stays open without a token (an empty HealthCheckRequest).
  EXPECT_TRUE(call("/grpc.health.v1.Health/Check", "", "").ok());
  (*server)->Shutdown(absl::Seconds(1));
}

TEST_F(TlsTest, BadOptionsFailStart) {
  ServerOptions only_cert;
  only_cert.tls_cert = certs_.path("server.crt");
  EXPECT_EQ(RollpackServer::Start(only_cert).status().code(),
            absl::StatusCode::kInvalidArgument);
  ServerOptions missing;
  missing.tls_cert = certs_.path("nope.crt");
  missing.tls_key = certs_.path("server.key");
  EXPECT_EQ(RollpackServer::Start(missing).status().code(), absl::StatusCode::kInvalidArgument);
}


}  // namespace
}  // namespace rollpack
