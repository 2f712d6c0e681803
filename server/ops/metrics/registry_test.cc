// The in-tree metrics registry: exact text exposition format 0.0.4.
#include "server/ops/metrics/registry.h"

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack::metrics {
namespace {

using ::testing::HasSubstr;

TEST(RegistryTest, CounterAndGaugeExposition) {
  Registry r;
  auto& c = r.AddCounter("rp_requests_total", "Requests.");
  c.Add({{"method", "Put"}}).Increment();
  c.Add({{"method", "Put"}}).Increment(2);
  c.Add({{"method", "Get"}}).Increment(0.5);
  c.Add({{"method", "Get"}}).Increment(-7);  // ignored: counters only go up
  auto& g = r.AddGauge("rp_bytes", "Bytes held.");
  g.Add({}).Set(1e12);
  g.Add({}).Decrement(1);
  EXPECT_EQ(r.Serialize(),
            "# HELP rp_requests_total Requests.\n"
            "# TYPE rp_requests_total counter\n"
            "rp_requests_total{method=\"Get\"} 0.5\n"
            "rp_requests_total{method=\"Put\"} 3\n"
            "# HELP rp_bytes Bytes held.\n"
            "# TYPE rp_bytes gauge\n"
            "rp_bytes 999999999999\n");
}

TEST(RegistryTest, EscapesLabelValuesAndHelp) {
  Registry r;
  auto& c = r.AddCounter("rp_x_total", "Line one\nback\\slash \"quoted\".");
  c.Add({{"pool", "a\"b\\c\nd"}, {"z", ""}}).Increment();
  EXPECT_EQ(r.Serialize(),
            "# HELP rp_x_total Line one\\nback\\\\slash \"quoted\".\n"
            "# TYPE rp_x_total counter\n"
            "rp_x_total{pool=\"a\\\"b\\\\c\\nd\",z=\"\"} 1\n");
}

TEST(RegistryTest, HistogramBucketsAreCumulativeWithInfSumCount) {
  Registry r;
  auto& h = r.AddHistogram("rp_latency_seconds", "Latency.");
  Histogram& m = h.Add({{"method", "Get"}}, Histogram::BucketBoundaries{0.005, 0.1, 1});
  for (double v : {0.001, 0.005, 0.05, 0.5, 3.0, 7.0}) m.Observe(v);
  EXPECT_EQ(r.Serialize(),
            "# HELP rp_latency_seconds Latency.\n"
            "# TYPE rp_latency_seconds histogram\n"
            "rp_latency_seconds_bucket{method=\"Get\",le=\"0.005\"} 2\n"
            "rp_latency_seconds_bucket{method=\"Get\",le=\"0.1\"} 3\n"
            "rp_latency_seconds_bucket{method=\"Get\",le=\"1\"} 4\n"
            "rp_latency_seconds_bucket{method=\"Get\",le=\"+Inf\"} 6\n"
            "rp_latency_seconds_sum{method=\"Get\"} 10.556000000000001\n"
            "rp_latency_seconds_count{method=\"Get\"} 6\n");
}

TEST(RegistryTest, FormatsSpecialValues) {
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(1e300), "1e+300");
  EXPECT_EQ(FormatValue(123456789012.5), "123456789012.5");
  EXPECT_EQ(std::strtod(FormatValue(0.1 + 0.2).c_str(), nullptr), 0.1 + 0.2);
}

TEST(RegistryTest, NameValidation) {
  EXPECT_TRUE(IsValidMetricName("rollpack_x:y_total"));
  EXPECT_FALSE(IsValidMetricName("9x"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_TRUE(IsValidLabelName("pool"));
  EXPECT_FALSE(IsValidLabelName("__name"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
}

TEST(RegistryDeathTest, RejectsDuplicateNamesAndReservedLabels) {
  EXPECT_DEATH(
      {
        Registry r;
        r.AddCounter("rp_a_total", "a");
        r.AddGauge("rp_a_total", "b");
      },
      "duplicate");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddHistogram("rp_h_seconds", "h").Add({{"le", "1"}}, Histogram::BucketBoundaries{1});
      },
      "invalid label");
  EXPECT_DEATH(Histogram(Histogram::BucketBoundaries{1, 1}), "increasing");
}

TEST(RegistryTest, CollectCallbacksRunBeforeEachScrape) {
  Registry r;
  auto& g = r.AddGauge("rp_scrapes", "Scrapes.");
  int calls = 0;
  r.AddCollectCallback([&] { g.Add({}).Set(++calls); });
  EXPECT_THAT(r.Serialize(), HasSubstr("rp_scrapes 1\n"));
  EXPECT_THAT(r.Serialize(), HasSubstr("rp_scrapes 2\n"));
}

TEST(RegistryTest, ConcurrentUpdatesAreNotLost) {
  Registry r;
  auto& c = r.AddCounter("rp_c_total", "c");
  auto& h = r.AddHistogram("rp_h_seconds", "h");
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) {
        c.Add({{"shard", std::to_string(t % 2)}}).Increment();
        h.Add({}, Histogram::BucketBoundaries{0.5}).Observe(i % 2);
        if (i % 1000 == 0) r.Serialize();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(c.Add({{"shard", "0"}}).Value() + c.Add({{"shard", "1"}}).Value(), 80000);
  const Histogram::Snapshot s = h.Add({}, Histogram::BucketBoundaries{0.5}).Collect();
  EXPECT_EQ(s.count, 80000u);
  EXPECT_EQ(s.cumulative[0], 40000u);
  EXPECT_EQ(s.sum, 40000);
}

TEST(RegistryTest, ExponentialBuckets) {
  EXPECT_THAT(Histogram::ExponentialBuckets(1, 2, 4), ::testing::ElementsAre(1, 2, 4, 8));
}

}  // namespace
}  // namespace rollpack::metrics
