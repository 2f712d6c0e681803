// Operations features of an in-process server on 127.0.0.1 (ephemeral
// ports): the /metrics endpoint and what it counts, token auth per method
// and role, TLS and mutual TLS with certificates made by openssl at test
// time, the stream limit.
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
#include "httplib.h"
#include "testing/exposition.h"
#include "server/ops/auth.h"
#include "server/server.h"

namespace rollpack {
namespace {

// Calls `method` (registered or not) with an empty request through the
// generic stub and returns its status.
grpc::Status EmptyUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                            grpc::ClientContext* ctx, const std::string& method) {
  grpc::GenericStub generic(channel);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  generic.UnaryCall(ctx, method, grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
  done.WaitForNotification();
  return status;
}

using ::testing::HasSubstr;

// A fresh directory under $TMPDIR, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "rollpack-ops-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("qwen-like");
  m.set_num_layers(4);
  m.set_num_experts(32);
  m.set_topk(4);
  return m;
}

std::vector<v1::Sample> Samples(int num, int64_t max_length, uint64_t seed = 1) {
  SyntheticOptions options;
  options.num_samples = num;
  options.median_length = static_cast<double>(max_length) / 4;
  options.max_length = max_length;
  options.seed = seed;
  return MakeSyntheticRollouts(Model(), options);
}

v1::CreateStepRequest StepRequest(const std::string& step_id, const std::string& pool, int num,
                                  int dp, int64_t max_tokens) {
  v1::CreateStepRequest create;
  create.set_step_id(step_id);
  create.set_pool(pool);
  create.set_num_samples(num);
  create.mutable_topology()->set_dp(dp);
  create.mutable_topology()->set_max_tokens_per_rank(max_tokens);
  return create;
}

// ------------------------------------------------------------------ metrics

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.metrics_listen = "127.0.0.1:0";
    options.max_memory_bytes = 1 << 30;
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->metrics_port(), 0);
    channel_ = MakeChannel(server_->address());
    client_ = std::make_unique<RollpackClient>(channel_);
  }
  void TearDown() override { server_->Shutdown(absl::Seconds(1)); }

  std::map<std::string, double> Scrape() {
    httplib::Client http("127.0.0.1", server_->metrics_port());
    httplib::Result res = http.Get("/metrics");
    EXPECT_TRUE(res) << "GET /metrics failed";
    if (!res) return {};
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
    return ParseExposition(res->body);
  }

  // A client sees a stream's final status before the server's reactor runs
  // OnDone, which is where the stream stops counting as active; scrape until
  // `series` reads `value` or the deadline passes, and return the last scrape.
  std::map<std::string, double> ScrapeOnceSettled(const std::string& series, double value) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    std::map<std::string, double> m = Scrape();
    while (m[series] != value && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
      m = Scrape();
    }
    return m;
  }

  std::unique_ptr<RollpackServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<RollpackClient> client_;
};

TEST_F(MetricsTest, CountsAWholeStepLife) {
  ASSERT_TRUE(client_->RegisterModel("p", Model()).ok());
  const std::vector<v1::Sample> samples = Samples(24, 1024);
  absl::StatusOr<v1::PutSamplesResponse> put = client_->PutSamples("p", samples);
  ASSERT_TRUE(put.ok()) << put.status();
  // Identical re-send: duplicates, no new bytes.
  ASSERT_TRUE(client_->PutSamples("p", absl::MakeSpan(samples).subspan(0, 5)).ok());
  // Refused: unknown pool.
  EXPECT_EQ(client_->PutSamples("nope", samples).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->GetPlan("missing").status().code(), absl::StatusCode::kNotFound);

  auto m = Scrape();
  EXPECT_EQ(m["rollpack_ingested_samples_total{pool=\"p\"}"], 24);
  EXPECT_EQ(m["rollpack_duplicate_samples_total{pool=\"p\"}"], 5);
  EXPECT_EQ(m["rollpack_ingested_bytes_total{pool=\"p\"}"], put->stored_bytes());
  // Unregistered pool names share one series (clients cannot add labels).
  EXPECT_EQ(m["rollpack_put_refusals_total{pool=\"(unregistered)\",reason=\"not_found\"}"], 1);
  EXPECT_EQ(m.count("rollpack_put_refusals_total{pool=\"nope\",reason=\"not_found\"}"), 0u);
  EXPECT_EQ(m["rollpack_store_bytes"], put->stored_bytes());
  EXPECT_EQ(m["rollpack_store_max_bytes"], 1 << 30);
  EXPECT_EQ(m["rollpack_pool_samples{pool=\"p\"}"], 24);
  EXPECT_EQ(m["rollpack_pool_free_samples{pool=\"p\"}"], 24);
  EXPECT_EQ(m["rollpack_grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"PutSamples\","
              "grpc_service=\"rollpack.v1.Rollouts\"}"],
            2);
  EXPECT_EQ(m["rollpack_grpc_server_handled_total{grpc_code=\"NOT_FOUND\",grpc_method="
              "\"PutSamples\",grpc_service=\"rollpack.v1.Rollouts\"}"],
            1);
  EXPECT_EQ(m["rollpack_grpc_server_handled_total{grpc_code=\"NOT_FOUND\",grpc_method="
              "\"GetPlan\",grpc_service=\"rollpack.v1.Scheduler\"}"],
            1);
  EXPECT_EQ(m["rollpack_grpc_server_handling_seconds_count{grpc_method=\"PutSamples\","
              "grpc_service=\"rollpack.v1.Rollouts\"}"],
            3);

  absl::StatusOr<v1::StepInfo> step = client_->CreateStep(StepRequest("s1", "p", 24, 2, 1024));
  ASSERT_TRUE(step.ok()) << step.status();
  int64_t received = 0;
  int64_t received_bytes = 0;
  for (int dp = 0; dp < 2; ++dp) {
    v1::RankCoords rank;
    rank.set_dp(dp);
    TrainerStream stream(channel_, "s1", rank);
    while (true) {
      absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
      ASSERT_TRUE(next.ok()) << next.status();
      if (!next->has_value()) break;
      ++received;
      received_bytes += static_cast<int64_t>((*next)->ByteSizeLong());
    }
  }
  // One resumed stream: the last micro-batch of rank 0 again.
  {
    v1::RankCoords rank;
    TrainerStreamOptions options;
    options.start_index = step->num_microbatches() - 1;
    TrainerStream stream(channel_, "s1", rank, options);
    absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
    ASSERT_TRUE(next.ok() && next->has_value());
    ++received;
    received_bytes += static_cast<int64_t>((*next)->ByteSizeLong());
    ASSERT_FALSE(stream.Next()->has_value());
  }
  EXPECT_EQ(received, 2 * step->num_microbatches() + 1);

  m = ScrapeOnceSettled("rollpack_active_streams", 0);
  EXPECT_EQ(m["rollpack_steps_created_total{pool=\"p\"}"], 1);
  EXPECT_EQ(m["rollpack_plan_duration_seconds_count{pool=\"p\"}"], 1);
  EXPECT_DOUBLE_EQ(m["rollpack_last_plan_rank_imbalance_ratio{pool=\"p\"}"],
                   step->stats().rank_imbalance());
  EXPECT_DOUBLE_EQ(m["rollpack_last_plan_sync_ratio{pool=\"p\"}"], step->stats().sync());
  EXPECT_DOUBLE_EQ(m["rollpack_last_plan_padding_overhead_ratio{pool=\"p\"}"],
                   step->stats().padding_overhead());
  EXPECT_EQ(m["rollpack_last_plan_microbatches{pool=\"p\"}"], step->num_microbatches());
  EXPECT_EQ(m["rollpack_live_steps"], 1);
  EXPECT_EQ(m["rollpack_pool_free_samples{pool=\"p\"}"], 0);
  EXPECT_EQ(m["rollpack_streamed_microbatches_total"], received);
  EXPECT_EQ(m["rollpack_streamed_bytes_total"], received_bytes);
  EXPECT_EQ(m["rollpack_stream_resumes_total"], 1);
  EXPECT_EQ(m["rollpack_active_streams"], 0);

  absl::StatusOr<v1::ReleaseStepResponse> released = client_->ReleaseStep("s1");
  ASSERT_TRUE(released.ok());
  m = Scrape();
  EXPECT_EQ(m["rollpack_steps_released_total"], 1);
  EXPECT_EQ(m["rollpack_released_samples_total"], 24);
  EXPECT_EQ(m["rollpack_released_bytes_total"], released->freed_bytes());
  EXPECT_EQ(m["rollpack_store_bytes"], 0);
  EXPECT_EQ(m["rollpack_live_steps"], 0);
}

TEST_F(MetricsTest, MadeUpMethodsShareOneSeries) {
  for (const char* method : {"/rollpack.v1.Rollouts/Nope", "/x.Y/Z"}) {
    grpc::ClientContext ctx;
    EXPECT_EQ(EmptyUnaryCall(channel_, &ctx, method).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  EXPECT_EQ(client_->GetPool("none").status().code(), absl::StatusCode::kNotFound);
  const auto m = Scrape();
  for (const auto& [key, value] : m) {
    if (key.rfind("rollpack_grpc_server_handled_total{", 0) != 0) continue;
    EXPECT_EQ(key.find("Nope"), std::string::npos) << key;
    EXPECT_EQ(key.find("x.Y"), std::string::npos) << key;
  }
  EXPECT_EQ(m.at("rollpack_grpc_server_handled_total{grpc_code=\"NOT_FOUND\",grpc_method="
                 "\"GetPool\",grpc_service=\"rollpack.v1.Rollouts\"}"),
            1);
}

TEST_F(MetricsTest, EndpointIsReadOnly) {
  httplib::Client http("127.0.0.1", server_->metrics_port());
  for (const char* path : {"/metrics", "/"}) {
    httplib::Result post = http.Post(path, "x", "text/plain");
    ASSERT_TRUE(post);
    EXPECT_EQ(post->status, 405) << path;
    httplib::Result del = http.Delete(path);
    ASSERT_TRUE(del);
    EXPECT_EQ(del->status, 405) << path;
  }
  httplib::Result other = http.Get("/admin");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
}

TEST(GrpcArgTest, ParsesNameEqualsInteger) {
  absl::StatusOr<std::pair<std::string, int>> arg =
      ParseGrpcIntArg("grpc.http2.lookahead_bytes=16777216");
  ASSERT_TRUE(arg.ok()) << arg.status();
  EXPECT_EQ(arg->first, "grpc.http2.lookahead_bytes");
  EXPECT_EQ(arg->second, 16777216);
  for (const char* bad : {"grpc.http2.bdp_probe", "=3", "a=x", "a=", "a=99999999999"}) {
    absl::StatusOr<std::pair<std::string, int>> refused = ParseGrpcIntArg(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr(bad));
  }
}

TEST(GrpcArgTest, ServerServesWithThem) {
  ServerOptions options;
  options.grpc_int_args = {{"grpc.http2.lookahead_bytes", 1 << 20}, {"grpc.http2.bdp_probe", 0}};
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  RollpackClient client(MakeChannel((*server)->address()));
  v1::ModelSpec model;
  model.set_name("m");
  model.set_num_layers(2);
  model.set_num_experts(8);
  model.set_topk(2);
  EXPECT_TRUE(client.RegisterModel("p", model).ok());
  (*server)->Shutdown(absl::Seconds(1));
}

TEST(MetricsStartTest, BusyMetricsPortFailsStart) {
  ServerOptions first;
  first.metrics_listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<RollpackServer>> a = RollpackServer::Start(first);
  ASSERT_TRUE(a.ok()) << a.status();
  ServerOptions second;
  second.metrics_listen = "127.0.0.1:" + std::to_string((*a)->metrics_port());
  absl::StatusOr<std::unique_ptr<RollpackServer>> b = RollpackServer::Start(second);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable) << b.status();
}

// --------------------------------------------------------------------- auth

constexpr char kProducer[] = "producer-token-0123456789";
constexpr char kTrainer[] = "trainer-token-0123456789";
constexpr char kAdmin[] = "admin-token-0123456789abc";

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
    EXPECT_TRUE(roles.count(Role::kAdmin)) << method << ": admins may call everything";
  }
  EXPECT_EQ(methods, table);
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
                                            "FetchMicrobatches", "ReportRoutingAgreement"};
  // Method -> roles allowed (must match the documented table).
  const std::map<std::string, std::set<std::string>> allowed = {
      {"RegisterModel", {"producer", "admin"}},
      {"PutSamples", {"producer", "admin"}},
      {"GetPool", {"producer", "trainer", "admin"}},
      {"CreateStep", {"trainer", "admin"}},
      {"GetPlan", {"trainer", "admin"}},
      {"ReleaseStep", {"admin"}},
      {"FetchMicrobatches", {"trainer", "admin"}},
      {"ReportRoutingAgreement", {"trainer", "admin"}},
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

// --------------------------------------------------------- per-pool memory

TEST(PoolMemoryTest, OnePoolCannotTakeTheWholeStore) {
  const std::vector<v1::Sample> samples = Samples(8, 512, 5);
  // The bytes of the first four samples, measured on an unlimited server.
  int64_t four = 0;
  {
    absl::StatusOr<std::unique_ptr<RollpackServer>> probe = RollpackServer::Start({});
    ASSERT_TRUE(probe.ok());
    RollpackClient client(MakeChannel((*probe)->address()));
    ASSERT_TRUE(client.RegisterModel("p", Model()).ok());
    absl::StatusOr<v1::PutSamplesResponse> put =
        client.PutSamples("p", absl::MakeSpan(samples).subspan(0, 4));
    ASSERT_TRUE(put.ok());
    four = put->stored_bytes();
  }
  ServerOptions options;
  options.max_pool_memory_bytes = four;
  options.metrics_listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  RollpackClient client(MakeChannel((*server)->address()));
  ASSERT_TRUE(client.RegisterModel("a", Model()).ok());
  ASSERT_TRUE(client.RegisterModel("b", Model()).ok());
  ASSERT_TRUE(client.PutSamples("a", absl::MakeSpan(samples).subspan(0, 4)).ok());
  absl::StatusOr<v1::PutSamplesResponse> over =
      client.PutSamples("a", absl::MakeSpan(samples).subspan(4, 1));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("pool \"a\""));
  EXPECT_THAT(over.status().message(), HasSubstr("--max-pool-memory"));
  // Another pool still has its own room.
  EXPECT_TRUE(client.PutSamples("b", absl::MakeSpan(samples).subspan(0, 4)).ok());
  const std::string text = (*server)->metrics_registry().Serialize();
  EXPECT_THAT(text, HasSubstr("rollpack_pool_max_bytes " + std::to_string(four) + "\n"));
  EXPECT_THAT(text, HasSubstr(
      "rollpack_put_refusals_total{pool=\"a\",reason=\"resource_exhausted\"} 1\n"));
  (*server)->Shutdown(absl::Seconds(1));
}

// ------------------------------------------------------------- stream limit

TEST(StreamLimitTest, RefusesStreamsPastTheLimitAndRecovers) {
  ServerOptions options;
  options.fetch.max_concurrent_streams = 1;
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeChannel((*server)->address());
  RollpackClient client(channel);
  ASSERT_TRUE(client.RegisterModel("p", Model()).ok());
  // Enough bytes per rank that an unread stream stalls on flow control.
  ASSERT_TRUE(client.PutSamples("p", Samples(64, 8192, 3)).ok());
  ASSERT_TRUE(client.CreateStep(StepRequest("big", "p", 64, 1, 8192)).ok());
  auto stub = v1::Trainer::NewStub(channel);
  v1::FetchRequest req;
  req.set_step_id("big");

  auto held_ctx = std::make_unique<grpc::ClientContext>();
  auto held = stub->FetchMicrobatches(held_ctx.get(), req);
  v1::Microbatch mb;
  ASSERT_TRUE(held->Read(&mb));  // in flight, not finished

  auto Fetch = [&] {
    grpc::ClientContext ctx;
    auto reader = stub->FetchMicrobatches(&ctx, req);
    v1::Microbatch m;
    int n = 0;
    while (reader->Read(&m)) ++n;
    return std::make_pair(reader->Finish(), n);
  };
  const auto refused = Fetch();
  EXPECT_EQ(refused.first.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.first.error_message();
  EXPECT_THAT(refused.first.error_message(), HasSubstr("--max-concurrent-streams"));

  held_ctx->TryCancel();
  held->Finish();
  // The slot frees once the server sees the cancellation.
  grpc::Status s;
  for (int i = 0; i < 200; ++i) {
    const auto again = Fetch();
    s = again.first;
    if (s.ok()) {
      EXPECT_GT(again.second, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT((*server)->metrics_registry().Serialize(),
              HasSubstr("rollpack_streams_refused_total "));
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace rollpack
