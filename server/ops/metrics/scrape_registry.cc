#include "server/ops/metrics/scrape_registry.h"

#include <utility>

#include "absl/container/flat_hash_map.h"

#include "prometheus/text_serializer.h"

namespace rollpack::metrics {

void ScrapeRegistry::Declare(const std::string& name, const std::string& help,
                             prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  absl::MutexLock lock(&declared_mu_);
  declared_.push_back(std::move(family));
}

Family<Counter>& ScrapeRegistry::AddCounter(const std::string& name, const std::string& help) {
  Family<Counter>& family = prometheus::BuildCounter().Name(name).Help(help).Register(registry_);
  Declare(name, help, prometheus::MetricType::Counter);
  return family;
}

Family<Gauge>& ScrapeRegistry::AddGauge(const std::string& name, const std::string& help) {
  Family<Gauge>& family = prometheus::BuildGauge().Name(name).Help(help).Register(registry_);
  Declare(name, help, prometheus::MetricType::Gauge);
  return family;
}

Family<Histogram>& ScrapeRegistry::AddHistogram(const std::string& name,
                                                const std::string& help) {
  Family<Histogram>& family =
      prometheus::BuildHistogram().Name(name).Help(help).Register(registry_);
  Declare(name, help, prometheus::MetricType::Histogram);
  return family;
}

void ScrapeRegistry::AddCollectCallback(std::function<void()> callback) {
  absl::MutexLock lock(&callbacks_mu_);
  callbacks_.push_back(std::move(callback));
}

std::vector<prometheus::MetricFamily> ScrapeRegistry::Collect() const {
  absl::MutexLock collect_lock(&collect_mu_);
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&callbacks_mu_);
    callbacks = callbacks_;
  }
  for (const auto& callback : callbacks) callback();
  std::vector<prometheus::MetricFamily> collected = registry_.Collect();
  absl::flat_hash_map<std::string, prometheus::MetricFamily*> by_name;
  for (prometheus::MetricFamily& family : collected) by_name[family.name] = &family;
  absl::MutexLock lock(&declared_mu_);
  std::vector<prometheus::MetricFamily> out;
  out.reserve(declared_.size());
  for (const prometheus::MetricFamily& declared : declared_) {
    auto it = by_name.find(declared.name);
    out.push_back(it != by_name.end() ? std::move(*it->second) : declared);
  }
  return out;
}

std::string ScrapeRegistry::SerializeText() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count) {
  Histogram::BucketBoundaries bounds;
  bounds.reserve(count);
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

}  // namespace rollpack::metrics
