// The metrics endpoint on 127.0.0.1 ephemeral ports: what a scrape returns,
// read-only methods, a busy port, basic auth.
#include "server/ops/metrics/metrics_endpoint.h"

#include <fstream>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace rollpack::metrics {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<ScrapeRegistry> RegistryWithOneCounter(int* collects) {
  auto registry = std::make_shared<ScrapeRegistry>();
  Family<Counter>& family = registry->AddCounter("test_things_total", "Things, by kind.");
  family.Add({{"kind", "a\"b"}}).Increment(3);
  Family<Gauge>& gauge = registry->AddGauge("test_collects", "Scrape-time callbacks run.");
  registry->AddCollectCallback([collects, &gauge] { gauge.Add({}).Set(++*collects); });
  return registry;
}

std::unique_ptr<MetricsEndpoint> StartOrDie(MetricsEndpointOptions options,
                                            std::shared_ptr<ScrapeRegistry> registry) {
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(options, std::move(registry));
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  return endpoint.ok() ? *std::move(endpoint) : nullptr;
}

TEST(ScrapeRegistryTest, CallbacksRunBeforeEveryCollect) {
  int collects = 0;
  std::shared_ptr<ScrapeRegistry> registry = RegistryWithOneCounter(&collects);
  const std::string first = registry->SerializeText();
  EXPECT_THAT(first, HasSubstr("# HELP test_things_total Things, by kind.\n"));
  EXPECT_THAT(first, HasSubstr("# TYPE test_things_total counter\n"));
  EXPECT_THAT(first, HasSubstr("test_things_total{kind=\"a\\\"b\"} 3\n"));
  EXPECT_THAT(first, HasSubstr("test_collects 1\n"));
  EXPECT_THAT(registry->SerializeText(), HasSubstr("test_collects 2\n"));
}

TEST(ScrapeRegistryTest, FamiliesWithoutSeriesKeepHelpAndTypeInRegistrationOrder) {
  ScrapeRegistry registry;
  registry.AddGauge("test_b", "Second.");
  registry.AddHistogram("test_a_seconds", "Third.").Add({{"pool", "p"}}, ExponentialBuckets(1, 2, 2));
  registry.AddCounter("test_c_total", "Fourth, no series.");
  const std::string text = registry.SerializeText();
  const size_t b = text.find("# TYPE test_b gauge\n");
  const size_t a = text.find("# TYPE test_a_seconds histogram\n");
  const size_t c = text.find("# HELP test_c_total Fourth, no series.\n# TYPE test_c_total counter\n");
  ASSERT_NE(b, std::string::npos) << text;
  ASSERT_NE(a, std::string::npos) << text;
  ASSERT_NE(c, std::string::npos) << text;
  EXPECT_LT(b, a);
  EXPECT_LT(a, c);
  EXPECT_THAT(text, HasSubstr("test_a_seconds_bucket{pool=\"p\",le=\"2\"} 0\n"));
}

TEST(ScrapeRegistryTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(0.5, 2.0, 4), (Histogram::BucketBoundaries{0.5, 1, 2, 4}));
}

TEST(MetricsEndpointTest, ServesTheRegistryReadOnly) {
  int collects = 0;
  MetricsEndpointOptions options;
  options.listen = "127.0.0.1:0";
  std::unique_ptr<MetricsEndpoint> endpoint =
      StartOrDie(options, RegistryWithOneCounter(&collects));
  ASSERT_NE(endpoint, nullptr);
  ASSERT_GT(endpoint->port(), 0);
  httplib::Client http("127.0.0.1", endpoint->port());
  httplib::Result res = http.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_THAT(res->get_header_value("Content-Type"), HasSubstr("text/plain"));
  EXPECT_THAT(res->body, HasSubstr("test_things_total{kind=\"a\\\"b\"} 3\n"));
  EXPECT_THAT(res->body, HasSubstr("test_collects 1\n"));

  httplib::Result index = http.Get("/");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->status, 200);
  EXPECT_THAT(index->body, HasSubstr("GET /metrics"));
  for (const char* path : {"/metrics", "/", "/other"}) {
    httplib::Result post = http.Post(path, "x", "text/plain");
    ASSERT_TRUE(post);
    EXPECT_EQ(post->status, 405) << path;
    EXPECT_EQ(post->get_header_value("Allow"), "GET") << path;
    httplib::Result del = http.Delete(path);
    ASSERT_TRUE(del);
    EXPECT_EQ(del->status, 405) << path;
  }
  for (const char* path : {"/admin", "/metrics/x", "/metricsx"}) {
    httplib::Result other = http.Get(path);
    ASSERT_TRUE(other);
    EXPECT_EQ(other->status, 404) << path;
  }
}

TEST(MetricsEndpointTest, BusyPortIsRefusedByName) {
  MetricsEndpointOptions options;
  options.listen = "127.0.0.1:0";
  std::unique_ptr<MetricsEndpoint> first =
      StartOrDie(options, std::make_shared<ScrapeRegistry>());
  ASSERT_NE(first, nullptr);
  options.listen = "127.0.0.1:" + std::to_string(first->port());
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> second =
      MetricsEndpoint::Start(options, std::make_shared<ScrapeRegistry>());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(options.listen + ": address in use"));
}

TEST(MetricsEndpointTest, MalformedOptionsAreRefused) {
  MetricsEndpointOptions options;
  for (const char* listen : {"127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000"}) {
    options.listen = listen;
    EXPECT_EQ(MetricsEndpoint::Start(options, std::make_shared<ScrapeRegistry>()).status().code(),
              absl::StatusCode::kInvalidArgument)
        << listen;
  }
}

TEST(MetricsEndpointTest, BasicAuth) {
  int collects = 0;
  MetricsEndpointOptions options;
  options.listen = "127.0.0.1:0";
  options.basic_auth = {{"prometheus", "s3cret"}, {"other", "pw"}};
  std::unique_ptr<MetricsEndpoint> endpoint =
      StartOrDie(options, RegistryWithOneCounter(&collects));
  ASSERT_NE(endpoint, nullptr);
  httplib::Client http("127.0.0.1", endpoint->port());
  httplib::Result none = http.Get("/metrics");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  http.set_basic_auth("prometheus", "wrong");
  httplib::Result wrong = http.Get("/metrics");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(collects, 0) << "an unauthenticated scrape ran the collectors";
  http.set_basic_auth("prometheus", "s3cret");
  httplib::Result right = http.Get("/metrics");
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200);
  EXPECT_THAT(right->body, HasSubstr("test_things_total"));
}

TEST(MetricsEndpointTest, BasicAuthFile) {
  const std::string path = ::testing::TempDir() + "/metrics_users";
  std::ofstream(path) << "# users\n\nprometheus:a:b \r\n";
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> users =
      ReadBasicAuthFile(path);
  ASSERT_TRUE(users.ok()) << users.status();
  ASSERT_EQ(users->size(), 1u);
  EXPECT_EQ((*users)[0], std::make_pair(std::string("prometheus"), std::string("a:b ")))
      << "the password keeps its spaces";
  std::ofstream(path) << "prometheus:pw\nno-password\n";
  users = ReadBasicAuthFile(path);
  EXPECT_EQ(users.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(users.status().message(), HasSubstr("line 2: expected user:password"));
  EXPECT_EQ(ReadBasicAuthFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rollpack::metrics
