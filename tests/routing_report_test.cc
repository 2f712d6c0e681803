// Telemetry.ReportRoutingAgreement on an in-process server (127.0.0.1,
// ephemeral ports): reports from several ranks are summed exactly into the
// rollpack_routing_* metrics of /metrics, the last-step gauges follow the
// newest step, and bad reports are refused with a code and a message naming
// the field and value, without touching the metrics.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "client/cpp/client.h"
#include "testing/synthetic_rollouts.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "testing/exposition.h"
#include "server/server.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

constexpr int kTopk = 4;

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("routing-report");
  m.set_num_layers(4);
  m.set_num_experts(32);
  m.set_topk(kTopk);
  return m;
}

struct Layer {
  int layer;
  int64_t rows, disagreeing, overlapping;
};

v1::RoutingAgreementReport Report(const std::string& step, int pp, std::vector<Layer> layers,
                                  int topk = kTopk) {
  v1::RoutingAgreementReport r;
  r.set_step_id(step);
  r.mutable_rank()->set_pp(pp);
  r.set_topk(topk);
  for (const Layer& l : layers) {
    v1::LayerAgreement* out = r.add_layers();
    out->set_layer(l.layer);
    out->set_rows_compared(l.rows);
    out->set_rows_disagreeing(l.disagreeing);
    out->set_overlapping_experts(l.overlapping);
  }
  return r;
}

class RoutingReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.metrics_listen = "127.0.0.1:0";
    options.max_memory_bytes = 1 << 30;
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = std::make_unique<RollpackClient>(MakeChannel(server_->address()));
    ASSERT_TRUE(client_->RegisterModel("p", Model()).ok());
    SyntheticOptions synthetic;
    synthetic.num_samples = 8;
    synthetic.median_length = 64;
    synthetic.max_length = 256;
    ASSERT_TRUE(client_->PutSamples("p", MakeSyntheticRollouts(Model(), synthetic)).ok());
  }
  void TearDown() override { server_->Shutdown(absl::Seconds(1)); }

  // A step of `num` samples on pp = 2: stage 0 replays layers 0-1, stage 1
  // layers 2-3 (checked against what the server says).
  v1::StepInfo CreateStep(const std::string& id, int num) {
    v1::CreateStepRequest create;
    create.set_step_id(id);
    create.set_pool("p");
    create.set_num_samples(num);
    create.mutable_topology()->set_pp(2);
    create.mutable_topology()->set_max_tokens_per_rank(kMaxTokens);
    absl::StatusOr<v1::StepInfo> step = client_->CreateStep(create);
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return {};
    EXPECT_EQ(step->stage_layers_size(), 2);
    EXPECT_THAT(step->stage_layers(0).replay_layers(), ::testing::ElementsAre(0, 1));
    EXPECT_THAT(step->stage_layers(1).replay_layers(), ::testing::ElementsAre(2, 3));
    return *step;
  }

  std::map<std::string, double> Scrape() {
    httplib::Client http("127.0.0.1", server_->metrics_port());
    httplib::Result res = http.Get("/metrics");
    EXPECT_TRUE(res) << "GET /metrics failed";
    if (!res) return {};
    EXPECT_EQ(res->status, 200);
    return ParseExposition(res->body);
  }

  static constexpr int64_t kMaxTokens = 512;
  std::unique_ptr<RollpackServer> server_;
  std::unique_ptr<RollpackClient> client_;
};

TEST_F(RoutingReportTest, RanksAddUpExactlyInTheMetrics) {
  CreateStep("s1", 4);
  // Nothing reported yet: the families exist, no series do.
  std::map<std::string, double> m = Scrape();
  EXPECT_EQ(m.count("rollpack_routing_last_step_disagreement_ratio"), 0u);
  EXPECT_EQ(m.count("rollpack_routing_rows_compared_total{layer=\"0\"}"), 0u);

  absl::StatusOr<v1::RoutingAgreementAck> a =
      client_->ReportRoutingAgreement(Report("s1", 0, {{0, 100, 10, 370}, {1, 100, 0, 400}}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->step_rows_compared(), 200);
  EXPECT_EQ(a->step_rows_disagreeing(), 10);
  EXPECT_EQ(a->step_overlapping_experts(), 770);
  EXPECT_EQ(a->step_reports(), 1);
  a = client_->ReportRoutingAgreement(Report("s1", 1, {{2, 50, 5, 190}}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->step_rows_compared(), 250);
  EXPECT_EQ(a->step_rows_disagreeing(), 15);
  EXPECT_EQ(a->step_overlapping_experts(), 960);
  EXPECT_EQ(a->step_reports(), 2);

  m = Scrape();
  EXPECT_EQ(m["rollpack_routing_rows_compared_total{layer=\"0\"}"], 100);
  EXPECT_EQ(m["rollpack_routing_rows_compared_total{layer=\"1\"}"], 100);
  EXPECT_EQ(m["rollpack_routing_rows_compared_total{layer=\"2\"}"], 50);
  EXPECT_EQ(m.count("rollpack_routing_rows_compared_total{layer=\"3\"}"), 0u);
  EXPECT_EQ(m["rollpack_routing_rows_disagreeing_total{layer=\"0\"}"], 10);
  EXPECT_EQ(m["rollpack_routing_rows_disagreeing_total{layer=\"1\"}"], 0);
  EXPECT_EQ(m["rollpack_routing_rows_disagreeing_total{layer=\"2\"}"], 5);
  EXPECT_EQ(m["rollpack_routing_overlapping_experts_total{layer=\"0\"}"], 370);
  EXPECT_DOUBLE_EQ(m["rollpack_routing_last_step_disagreement_ratio"], 15.0 / 250);
  EXPECT_DOUBLE_EQ(m["rollpack_routing_last_step_mean_overlap_ratio"], 960.0 / (250 * kTopk));
  EXPECT_EQ(m["rollpack_grpc_server_handled_total{grpc_code=\"OK\",grpc_method="
              "\"ReportRoutingAgreement\",grpc_service=\"rollpack.v1.Telemetry\"}"],
            2);

  // A newer step takes the gauges; a straggler of s1 adds to the counters
  // and to s1's totals but leaves the gauges on s2.
  CreateStep("s2", 4);
  a = client_->ReportRoutingAgreement(Report("s2", 0, {{0, 10, 1, 38}}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->step_reports(), 1);
  m = Scrape();
  EXPECT_DOUBLE_EQ(m["rollpack_routing_last_step_disagreement_ratio"], 0.1);
  EXPECT_DOUBLE_EQ(m["rollpack_routing_last_step_mean_overlap_ratio"], 38.0 / 40);
  a = client_->ReportRoutingAgreement(Report("s1", 1, {{3, 40, 40, 0}}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->step_rows_compared(), 290);
  EXPECT_EQ(a->step_reports(), 3);
  m = Scrape();
  EXPECT_DOUBLE_EQ(m["rollpack_routing_last_step_disagreement_ratio"], 0.1);
  EXPECT_EQ(m["rollpack_routing_rows_compared_total{layer=\"0\"}"], 110);
  EXPECT_EQ(m["rollpack_routing_rows_disagreeing_total{layer=\"3\"}"], 40);
}

TEST_F(RoutingReportTest, AStepCreatedAgainUnderItsIdStartsFromZero) {
  CreateStep("again", 4);
  ASSERT_TRUE(client_->ReportRoutingAgreement(Report("again", 0, {{0, 8, 8, 0}})).ok());
  ASSERT_TRUE(client_->ReleaseStep("again").ok());
  CreateStep("again", 4);
  absl::StatusOr<v1::RoutingAgreementAck> a =
      client_->ReportRoutingAgreement(Report("again", 0, {{0, 8, 0, 32}}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->step_reports(), 1);
  EXPECT_EQ(a->step_rows_disagreeing(), 0);
  EXPECT_EQ(Scrape()["rollpack_routing_rows_compared_total{layer=\"0\"}"], 16);
}

TEST_F(RoutingReportTest, BadReportsAreRefusedNamingFieldAndValue) {
  const v1::StepInfo step = CreateStep("s", 4);
  const int64_t one_pass = int64_t{step.num_microbatches()} * kMaxTokens;
  struct Case {
    v1::RoutingAgreementReport report;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases = {
      {Report("nope", 0, {{0, 1, 0, 4}}), absl::StatusCode::kNotFound, "step \"nope\""},
      {Report("", 0, {{0, 1, 0, 4}}), absl::StatusCode::kInvalidArgument, "step_id is empty"},
      {Report("s", 2, {{2, 1, 0, 4}}), absl::StatusCode::kInvalidArgument,
       "pp coordinate 2 is outside [0, pp = 2)"},
      {Report("s", 0, {{0, 1, 0, 3}}, 3), absl::StatusCode::kInvalidArgument,
       "topk is 3, but step \"s\"'s model has topk 4"},
      {Report("s", 0, {}), absl::StatusCode::kInvalidArgument, "layers is empty"},
      {Report("s", 0, {{0, 1, 0, 4}, {2, 1, 0, 4}}), absl::StatusCode::kInvalidArgument,
       "layers[1].layer is 2, not a replay layer of pipeline stage pp=0 in step \"s\" (its "
       "replay layers: [0, 1])"},
      {Report("s", 1, {{-1, 1, 0, 4}}), absl::StatusCode::kInvalidArgument,
       "layers[0].layer is -1"},
      {Report("s", 0, {{1, 1, 0, 4}, {1, 1, 0, 4}}), absl::StatusCode::kInvalidArgument,
       "layers[1].layer 1 is listed twice"},
      {Report("s", 0, {{0, -1, 0, 0}}), absl::StatusCode::kInvalidArgument,
       "layers[0].rows_compared is -1"},
      {Report("s", 0, {{0, one_pass + 1, 0, 0}}), absl::StatusCode::kInvalidArgument,
       "layers[0].rows_compared is " + std::to_string(one_pass + 1) + ", outside [0, " +
           std::to_string(one_pass) + "]"},
      {Report("s", 0, {{0, std::numeric_limits<int64_t>::max(), 0, 0}}),
       absl::StatusCode::kInvalidArgument, "layers[0].rows_compared is 9223372036854775807"},
      {Report("s", 0, {{0, 10, 11, 40}}), absl::StatusCode::kInvalidArgument,
       "layers[0].rows_disagreeing is 11, outside [0, layers[0].rows_compared = 10]"},
      {Report("s", 0, {{0, 10, -1, 40}}), absl::StatusCode::kInvalidArgument,
       "layers[0].rows_disagreeing is -1"},
      {Report("s", 0, {{0, 10, 0, 41}}), absl::StatusCode::kInvalidArgument,
       "layers[0].overlapping_experts is 41, outside [0, layers[0].rows_compared * topk = 10 "
       "* 4]"},
      {Report("s", 0, {{0, 10, 0, -1}}), absl::StatusCode::kInvalidArgument,
       "layers[0].overlapping_experts is -1"},
  };
  v1::RoutingAgreementReport bad_dp = Report("s", 0, {{0, 1, 0, 4}});
  bad_dp.mutable_rank()->set_dp(5);
  cases.push_back({bad_dp, absl::StatusCode::kInvalidArgument, "dp coordinate 5"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.report.ShortDebugString());
    absl::StatusOr<v1::RoutingAgreementAck> a = client_->ReportRoutingAgreement(c.report);
    EXPECT_EQ(a.status().code(), c.code) << a.status();
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(c.message));
  }
  // Nothing of them was counted; the edge values are accepted.
  std::map<std::string, double> m = Scrape();
  EXPECT_EQ(m.count("rollpack_routing_rows_compared_total{layer=\"0\"}"), 0u);
  EXPECT_EQ(m.count("rollpack_routing_last_step_disagreement_ratio"), 0u);
  absl::StatusOr<v1::RoutingAgreementAck> edge =
      client_->ReportRoutingAgreement(Report("s", 0, {{0, one_pass, one_pass, one_pass * 4}}));
  ASSERT_TRUE(edge.ok()) << edge.status();
  EXPECT_EQ(Scrape()["rollpack_routing_last_step_disagreement_ratio"], 1.0);
}

// With --auth-tokens the trainer role may report, a producer may not, and no
// token is UNAUTHENTICATED (the method is in the role table).
TEST(RoutingReportAuthTest, TrainerRoleReports) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/routing-report-tokens";
  {
    std::ofstream out(path);
    out << "producer producer-token-0123456789\ntrainer trainer-token-0123456789\n";
  }
  ServerOptions options;
  options.auth_tokens_file = path;
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto call = [&](const std::string& token) {
    ClientOptions o;
    o.auth_token = token;
    RollpackClient client(MakeChannel((*server)->address(), o), o);
    return client.ReportRoutingAgreement(Report("no-step", 0, {{0, 1, 0, 4}})).status();
  };
  EXPECT_EQ(call("").code(), absl::StatusCode::kUnauthenticated);
  const absl::Status producer = call("producer-token-0123456789");
  EXPECT_EQ(producer.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(producer.message()), HasSubstr("role producer"));
  // The trainer gets through to the handler, which names the step.
  const absl::Status trainer = call("trainer-token-0123456789");
  EXPECT_EQ(trainer.code(), absl::StatusCode::kNotFound) << trainer;
  EXPECT_THAT(std::string(trainer.message()), HasSubstr("no-step"));
  (*server)->Shutdown(absl::Seconds(1));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace rollpack
