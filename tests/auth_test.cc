// Token auth per method and role: the role table covers every RPC, every
// served method checks the token before doing anything.
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
#include "server/server.h"
#include "testing/ops_fixtures.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// --------------------------------------------------------------------- auth


TEST(AuthorizerTest, ParsesTokenFile) {
  absl::StatusOr<Authorizer> a = Authorizer::Parse(
      "# comment\n\nproducer  producer-token-0123456789  # trailing\n"
      "trainer\ttrainer-token-0123456789\nadmin admin-token-0123456789abc\n");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->num_tokens(), 3u);
  EXPECT_TRUE(a->CheckHeader("Bearer producer-token-0123456789",
                             "/rollpack.v1.Rollouts/PutSamples").ok());
  EXPECT_THAT(Authorizer::Parse("root abcdefghijklmnopq\n").status().message(),
              HasSubstr("unknown role"));
  EXPECT_THAT(Authorizer::Parse("admin short\n").status().message(), HasSubstr("shorter"));
  EXPECT_THAT(Authorizer::Parse("admin a b\n").status().message(), HasSubstr("line 1"));
  EXPECT_THAT(
      Authorizer::Parse("admin abcdefghijklmnopq\ntrainer abcdefghijklmnopq\n").status().message(),
      HasSubstr("twice"));
  EXPECT_FALSE(Authorizer().enabled());
  TempDir dir;
  EXPECT_FALSE(Authorizer::FromFile(dir.Write("empty", "# nothing\n")).ok());
  EXPECT_FALSE(Authorizer::FromFile(dir.file("missing")).ok());
}

// Every RPC of every service in proto/rollpack/ (read from the .proto
// files, so a new service or method is caught) has a row in the role table:
// nothing ships open or unreachable by accident.
std::set<std::string> ProtoMethods() {
  std::set<std::string> methods;
  const std::regex service_re(R"(^service\s+(\w+))"), rpc_re(R"(^\s*rpc\s+(\w+)\s*\()");
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(ROLLPACK_SOURCE_DIR) + "/proto/rollpack/v1")) {
    if (entry.path().extension() != ".proto") continue;
    std::ifstream in(entry.path());
    std::string line, service;
    std::smatch m;
    while (std::getline(in, line)) {
      if (std::regex_search(line, m, service_re)) service = m[1];
      if (std::regex_search(line, m, rpc_re)) {
        methods.insert("/rollpack.v1." + service + "/" + std::string(m[1]));
      }
    }
  }
  return methods;
}

TEST(AuthorizerTest, RoleTableCoversEveryMethod) {
  const std::set<std::string> methods = ProtoMethods();
  EXPECT_GE(methods.size(), 7u);
  std::set<std::string> table;
  for (const auto& [method, roles] : MethodRoles()) {
    table.insert(method);
    if (method.rfind("/rollpack.v1.Member/", 0) == 0) {
      // Cluster members call each other with certificates, never tokens.
      EXPECT_EQ(roles, std::set<Role>{Role::kMember}) << method;
    } else {
      EXPECT_TRUE(roles.count(Role::kAdmin)) << method << ": admins may call everything else";
    }
  }
  EXPECT_EQ(methods, table);
}

// grpc::AuthPropertyIterator's end-of-properties value (its constructor is
// protected).
struct NoProperties : grpc::AuthPropertyIterator {};

// A connection's peer as gRPC's TLS handshake describes it.
class FakePeer final : public grpc::AuthContext {
 public:
  FakePeer(bool verified, std::string common_name)
      : verified_(verified), common_name_(std::move(common_name)) {}
  bool IsPeerAuthenticated() const override { return verified_; }
  std::vector<grpc::string_ref> GetPeerIdentity() const override {
    return FindPropertyValues("x509_common_name");
  }
  std::string GetPeerIdentityPropertyName() const override { return "x509_common_name"; }
  std::vector<grpc::string_ref> FindPropertyValues(const std::string& name) const override {
    if (name != "x509_common_name" || common_name_.empty()) return {};
    return {grpc::string_ref(common_name_)};
  }
  grpc::AuthPropertyIterator begin() const override { return NoProperties(); }
  grpc::AuthPropertyIterator end() const override { return NoProperties(); }
  void AddProperty(const std::string&, const grpc::string_ref&) override {}
  bool SetPeerIdentityPropertyName(const std::string&) override { return false; }

 private:
  const bool verified_;
  const std::string common_name_;
};

TEST(AuthorizerTest, MembersAreKnownByTheirVerifiedCertificateAlone) {
  absl::StatusOr<Authorizer> auth =
      Authorizer::Parse(std::string("admin ") + kAdmin + "\ntrainer " + kTrainer + "\n");
  ASSERT_TRUE(auth.ok());
  auth->set_member_identity("rollpack-member");
  const FakePeer member(true, "rollpack-member");
  const FakePeer unverified(false, "rollpack-member");
  const FakePeer trainer(true, "trainer-1");
  const std::string hold = "/rollpack.v1.Member/HoldSamples";
  const std::string admin_header = std::string("Bearer ") + kAdmin;

  EXPECT_TRUE(auth->CheckCall("", &member, hold).ok());
  // Not a member: refused whatever the token, the admin's included.
  EXPECT_EQ(auth->CheckCall(admin_header, &trainer, hold).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(auth->CheckCall(admin_header, &unverified, hold).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(auth->CheckCall(admin_header, nullptr, hold).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(auth->CheckHeader(admin_header, hold).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A member's certificate opens what members ask each other, nothing more.
  EXPECT_TRUE(auth->CheckCall("", &member, "/rollpack.v1.Rollouts/GetPool").ok());
  EXPECT_EQ(auth->CheckCall("", &member, "/rollpack.v1.Scheduler/ReleaseStep").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Clients keep their token roles.
  EXPECT_TRUE(auth->CheckCall(admin_header, &trainer, "/rollpack.v1.Scheduler/ReleaseStep").ok());
  EXPECT_EQ(auth->CheckCall(std::string("Bearer ") + kTrainer, &trainer,
                            "/rollpack.v1.Scheduler/ReleaseStep")
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // "member" is no role a token file can give.
  EXPECT_FALSE(Authorizer::Parse("member 0123456789abcdef0123\n").ok());

  // Without a member identity (a cluster on a trusted network) the Member
  // service is open when tokens are off.
  EXPECT_TRUE(Authorizer().CheckCall("", nullptr, hold).ok());
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.auth_tokens_file = dir_.Write(
        "tokens", std::string("producer ") + kProducer + "\ntrainer " + kTrainer + "\nadmin " +
                      kAdmin + "\n");
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = MakeChannel(server_->address());
    rollouts_ = v1::Rollouts::NewStub(channel_);
    scheduler_ = v1::Scheduler::NewStub(channel_);
    trainer_ = v1::Trainer::NewStub(channel_);
    telemetry_ = v1::Telemetry::NewStub(channel_);
  }
  void TearDown() override { server_->Shutdown(absl::Seconds(1)); }

  // `header` empty = no authorization metadata.
  std::unique_ptr<grpc::ClientContext> Context(const std::string& header) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!header.empty()) ctx->AddMetadata("authorization", header);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ctx;
  }

  grpc::Status Call(const std::string& method, const std::string& header) {
    auto ctx = Context(header);
    if (method == "RegisterModel") {
      v1::RegisterModelRequest req;
      req.set_pool("authpool");
      *req.mutable_model() = Model();
      v1::RegisterModelResponse resp;
      return rollouts_->RegisterModel(ctx.get(), req, &resp);
    }
    if (method == "PutSamples") {
      v1::PutSamplesResponse resp;
      auto writer = rollouts_->PutSamples(ctx.get(), &resp);
      writer->WritesDone();
      return writer->Finish();
    }
    if (method == "AnnotateSamples") {
      v1::AnnotateSamplesRequest req;
      req.set_pool("authpool");
      v1::AnnotateSamplesResponse resp;
      return rollouts_->AnnotateSamples(ctx.get(), req, &resp);
    }
    if (method == "GetPool") {
      v1::GetPoolRequest req;
      req.set_pool("authpool");
      v1::PoolInfo resp;
      return rollouts_->GetPool(ctx.get(), req, &resp);
    }
    if (method == "CreateStep") {
      v1::StepInfo resp;
      return scheduler_->CreateStep(ctx.get(), StepRequest("s", "authpool", 1, 1, 4096), &resp);
    }
    if (method == "GetPlan") {
      v1::GetPlanRequest req;
      req.set_step_id("s");
      v1::Plan resp;
      return scheduler_->GetPlan(ctx.get(), req, &resp);
    }
    if (method == "ReleaseStep") {
      v1::ReleaseStepRequest req;
      req.set_step_id("s");
      v1::ReleaseStepResponse resp;
      return scheduler_->ReleaseStep(ctx.get(), req, &resp);
    }
    if (method == "FetchMicrobatches") {
      v1::FetchRequest req;
      req.set_step_id("s");
      auto reader = trainer_->FetchMicrobatches(ctx.get(), req);
      v1::Microbatch mb;
      while (reader->Read(&mb)) {
      }
      return reader->Finish();
    }
    if (method == "ListPools") {
      v1::ListPoolsResponse resp;
      return rollouts_->ListPools(ctx.get(), v1::ListPoolsRequest(), &resp);
    }
    if (method == "DeletePool") {
      v1::DeletePoolRequest req;
      req.set_pool("authpool");
      req.set_dry_run(true);  // the roles are the test, not the deletion
      v1::DeletePoolResponse resp;
      return rollouts_->DeletePool(ctx.get(), req, &resp);
    }
    if (method == "ListSamples") {
      v1::ListSamplesRequest req;
      req.set_pool("authpool");
      v1::ListSamplesResponse resp;
      return rollouts_->ListSamples(ctx.get(), req, &resp);
    }
    if (method == "ListSteps") {
      v1::ListStepsResponse resp;
      return scheduler_->ListSteps(ctx.get(), v1::ListStepsRequest(), &resp);
    }
    if (method == "ReportRoutingAgreement") {
      v1::RoutingAgreementReport req;
      req.set_step_id("s");
      v1::RoutingAgreementAck resp;
      return telemetry_->ReportRoutingAgreement(ctx.get(), req, &resp);
    }
    ADD_FAILURE() << "no call for " << method;
    return grpc::Status::CANCELLED;
  }

  TempDir dir_;
  std::unique_ptr<RollpackServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rollouts::Stub> rollouts_;
  std::unique_ptr<v1::Scheduler::Stub> scheduler_;
  std::unique_ptr<v1::Trainer::Stub> trainer_;
  std::unique_ptr<v1::Telemetry::Stub> telemetry_;
};

TEST_F(AuthTest, EveryMethodByRole) {
  const std::vector<std::string> methods = {"RegisterModel",     "PutSamples", "GetPool",
                                            "CreateStep",        "GetPlan",    "ReleaseStep",
                                            "FetchMicrobatches", "ReportRoutingAgreement",
                                            "ListPools",         "ListSteps",
                                            "AnnotateSamples",   "DeletePool", "ListSamples"};
  // Method -> roles allowed (must match the documented table).
  const std::map<std::string, std::set<std::string>> allowed = {
      {"RegisterModel", {"producer", "admin"}},
      {"PutSamples", {"producer", "admin"}},
      {"AnnotateSamples", {"producer", "admin"}},
      {"GetPool", {"producer", "trainer", "admin"}},
      {"CreateStep", {"trainer", "admin"}},
      {"GetPlan", {"trainer", "admin"}},
      {"ReleaseStep", {"admin"}},
      {"FetchMicrobatches", {"trainer", "admin"}},
      {"ReportRoutingAgreement", {"trainer", "admin"}},
      {"ListPools", {"producer", "trainer", "admin"}},
      {"ListSteps", {"trainer", "admin"}},
      {"DeletePool", {"admin"}},
      {"ListSamples", {"producer", "trainer", "admin"}},
  };
  const std::map<std::string, std::string> tokens = {
      {"producer", kProducer}, {"trainer", kTrainer}, {"admin", kAdmin}};
  for (const std::string& method : methods) {
    SCOPED_TRACE(method);
    EXPECT_EQ(Call(method, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Call(method, "Bearer not-a-known-token-at-all").error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Call(method, std::string("Basic ") + kAdmin).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Call(method, std::string("Bearer ") + kAdmin + "x").error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    for (const auto& [role, token] : tokens) {
      SCOPED_TRACE(role);
      const grpc::Status s = Call(method, std::string("Bearer ") + token);
      if (allowed.at(method).count(role)) {
        EXPECT_NE(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
        EXPECT_NE(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
      } else {
        EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
        EXPECT_THAT(s.error_message(), HasSubstr("role " + role));
      }
    }
  }
}

// Every method of every rollpack service, called generically with no token
// and with an unknown one: the handler checks before doing anything.
TEST_F(AuthTest, EveryServedMethodRequiresAToken) {
  for (const std::string& method : ProtoMethods()) {
    // Served only by cluster members, which refuse --auth-tokens.
    if (method.rfind("/rollpack.v1.Member/", 0) == 0) continue;
    for (const std::string& header : {std::string(), std::string("Bearer nope-nope-nope-nope")}) {
      SCOPED_TRACE(method + " with '" + header + "'");
      grpc::ClientContext ctx;
      if (!header.empty()) ctx.AddMetadata("authorization", header);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      // Unary framing works for every shape here: the check runs before
      // the handler reads or writes anything.
      const grpc::Status status = EmptyUnaryCall(channel_, &ctx, method);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
    }
  }
}

TEST_F(AuthTest, AllowedCallsReachTheHandlers) {
  // RegisterModel by a producer really registers (then GetPool by a trainer
  // sees it); ReleaseStep by an admin reaches the store (NOT_FOUND names
  // the step).
  EXPECT_TRUE(Call("RegisterModel", std::string("Bearer ") + kProducer).ok());
  EXPECT_TRUE(Call("GetPool", std::string("Bearer ") + kTrainer).ok());
  const grpc::Status release = Call("ReleaseStep", std::string("Bearer ") + kAdmin);
  EXPECT_EQ(release.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AuthTest, TrainerStreamSendsItsToken) {
  auto first_status = [&](const std::string& token) {
    TrainerStreamOptions options;
    options.auth_token = token;
    TrainerStream stream(channel_, "no-such-step", v1::RankCoords(), options);
    absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
    return next.ok() ? absl::OkStatus() : next.status();
  };
  EXPECT_EQ(first_status("").code(), absl::StatusCode::kUnauthenticated);
  // With the trainer's token the call reaches the handler, which names the step.
  const absl::Status with_token = first_status(kTrainer);
  EXPECT_EQ(with_token.code(), absl::StatusCode::kNotFound) << with_token;
}

TEST_F(AuthTest, HealthStaysOpen) {
  grpc::ClientContext ctx;
  // An empty HealthCheckRequest: the server overall.
  const grpc::Status status = EmptyUnaryCall(channel_, &ctx, "/grpc.health.v1.Health/Check");
  EXPECT_TRUE(status.ok()) << status.error_message();
}


}  // namespace
}  // namespace rollpack
