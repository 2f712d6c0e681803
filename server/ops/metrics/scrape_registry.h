// The registry rollpackd's metrics live in: prometheus-cpp's Registry plus
// callbacks that run before every scrape, for gauges that are read from
// elsewhere (memory in use, pool sizes) rather than updated on every change.
//
// Families are prometheus-cpp's own (prometheus::BuildCounter() and friends
// register into registry()); this adds only the scrape-time hook, which
// prometheus-cpp 1.0 lacks.
#ifndef ROLLPACK_SERVER_OPS_METRICS_SCRAPE_REGISTRY_H_
#define ROLLPACK_SERVER_OPS_METRICS_SCRAPE_REGISTRY_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace rollpack::metrics {

using Labels = prometheus::Labels;
using Counter = prometheus::Counter;
using Gauge = prometheus::Gauge;
using Histogram = prometheus::Histogram;
template <typename T>
using Family = prometheus::Family<T>;

class ScrapeRegistry final : public prometheus::Collectable {
 public:
  ScrapeRegistry() = default;
  ScrapeRegistry(const ScrapeRegistry&) = delete;
  ScrapeRegistry& operator=(const ScrapeRegistry&) = delete;

  // Names must be valid Prometheus names and unique here; prometheus-cpp
  // throws std::invalid_argument otherwise (a programming error).
  Family<Counter>& AddCounter(const std::string& name, const std::string& help);
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help);
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help);

  // Runs, in the order added, before every Collect().
  void AddCollectCallback(std::function<void()> callback);

  // prometheus::Collectable: the callbacks, then every family, in the order
  // registered; a family without series yet still has its HELP and TYPE
  // (prometheus-cpp leaves it out), so scrapers and dashboards see every
  // metric rollpackd can export from its first scrape.
  std::vector<prometheus::MetricFamily> Collect() const override;

  // Collect() in the text exposition format (what a scrape returns).
  std::string SerializeText() const;

 private:
  void Declare(const std::string& name, const std::string& help, prometheus::MetricType type);

  // Throw, not prometheus-cpp's default Merge: a name registered twice is a
  // bug, not a family to share (it would be declared twice here).
  prometheus::Registry registry_{prometheus::Registry::InsertBehavior::Throw};
  mutable absl::Mutex declared_mu_;
  std::vector<prometheus::MetricFamily> declared_ ABSL_GUARDED_BY(declared_mu_);
  mutable absl::Mutex callbacks_mu_;
  std::vector<std::function<void()>> callbacks_ ABSL_GUARDED_BY(callbacks_mu_);
  // Serializes whole scrapes: callbacks set gauges that the collect reads.
  mutable absl::Mutex collect_mu_;
};

// Bounds start, start*factor, ... (count of them): latency histograms.
Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count);

}  // namespace rollpack::metrics

#endif  // ROLLPACK_SERVER_OPS_METRICS_SCRAPE_REGISTRY_H_
