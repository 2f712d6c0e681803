// The /metrics endpoint of an in-process server on 127.0.0.1 (ephemeral
// ports) and what it counts.
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
#include "server/ops/auth.h"
#include "server/ops/metrics/scrape_registry.h"
#include "server/server.h"
#include "testing/exposition.h"
#include "testing/ops_fixtures.h"
#include "testing/synthetic_rollouts.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

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
    EXPECT_THAT(res->get_header_value("Content-Type"), ::testing::StartsWith("text/plain"));
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
      // Bytes as received: with direct pulls (the default) a piece's
      // framing (PieceRows) is on the wire too.
      absl::StatusOr<std::optional<ReceivedMicrobatch>> next = stream.NextReceived();
      ASSERT_TRUE(next.ok()) << next.status();
      if (!next->has_value()) break;
      ++received;
      received_bytes += (*next)->wire_bytes();
    }
  }
  // One resumed stream: the last micro-batch of rank 0 again.
  {
    v1::RankCoords rank;
    TrainerStreamOptions options;
    options.start_index = step->num_microbatches() - 1;
    TrainerStream stream(channel_, "s1", rank, options);
    absl::StatusOr<std::optional<ReceivedMicrobatch>> next = stream.NextReceived();
    ASSERT_TRUE(next.ok() && next->has_value());
    ++received;
    received_bytes += (*next)->wire_bytes();
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


}  // namespace
}  // namespace rollpack
