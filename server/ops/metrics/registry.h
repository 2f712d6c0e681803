// A small in-tree metrics registry with prometheus-cpp's shape: a Registry
// holds Families of Counters, Gauges and Histograms keyed by label sets, and
// serializes them in the Prometheus text exposition format 0.0.4.
//
// Pure C++ (no gRPC, no HTTP). Swapping in prometheus-cpp later means
// replacing this file pair: the call sites use the same verbs
// (Family::Add(labels), Counter::Increment, Gauge::Set, Histogram::Observe,
// Registry::Serialize ~ prometheus::TextSerializer).
//
// Thread-safe: metric updates are lock-free atomics; Add() and Serialize()
// take the family's mutex. References returned by Add() stay valid for the
// life of the Registry.
#ifndef ROLLPACK_SERVER_OPS_METRICS_REGISTRY_H_
#define ROLLPACK_SERVER_OPS_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace rollpack::metrics {

// Label name -> value. Ordered, so a label set has one serialization.
using Labels = std::map<std::string, std::string>;

enum class MetricType { kCounter, kGauge, kHistogram };

class Counter {
 public:
  // Adds `v` (must be >= 0; negative values are ignored: counters only go up).
  void Increment(double v = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Increment(double v = 1.0);
  void Decrement(double v = 1.0) { Increment(-v); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  using BucketBoundaries = std::vector<double>;

  // `bounds` are the upper bounds (le) of the finite buckets, strictly
  // increasing; +Inf is implicit.
  explicit Histogram(BucketBoundaries bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    // Cumulative counts per finite bound, then the +Inf bucket (= count).
    std::vector<uint64_t> cumulative;
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Collect() const;
  const BucketBoundaries& bounds() const { return bounds_; }

  // Bounds start, start*factor, ... (count of them).
  static BucketBoundaries ExponentialBuckets(double start, double factor, int count);

 private:
  const BucketBoundaries bounds_;
  // One per finite bound plus +Inf, not cumulative.
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

// All metrics of one name and type, one per label set.
template <typename T>
class Family {
 public:
  Family(std::string name, std::string help, Labels const_labels)
      : name_(std::move(name)), help_(std::move(help)), const_labels_(std::move(const_labels)) {}

  // The metric with these labels, created on first use. For histograms the
  // extra arguments are the bucket boundaries (used on creation only).
  template <typename... Args>
  T& Add(const Labels& labels, Args&&... args);

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }

  // Calls f(labels, metric) for every metric, in label order.
  void ForEach(const std::function<void(const Labels&, const T&)>& f) const;

 private:
  const std::string name_;
  const std::string help_;
  const Labels const_labels_;
  mutable std::mutex mu_;
  std::map<Labels, std::unique_ptr<T>> metrics_;
};

class Registry {
 public:
  // Names must match [a-zA-Z_:][a-zA-Z0-9_:]* and be unique in the registry;
  // counters should end in _total. Violations abort (programming errors).
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              const Labels& const_labels = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          const Labels& const_labels = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  const Labels& const_labels = {});

  // Runs before every Serialize(): sets gauges that are read from elsewhere
  // (memory in use, pool sizes) instead of updated on every change.
  void AddCollectCallback(std::function<void()> callback);

  // Text exposition format 0.0.4 of every family, in registration order.
  std::string Serialize() const;

 private:
  struct Entry {
    MetricType type;
    void* family;
  };
  void CheckName(const std::string& name);

  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<std::unique_ptr<Family<Counter>>> counters_;
  std::vector<std::unique_ptr<Family<Gauge>>> gauges_;
  std::vector<std::unique_ptr<Family<Histogram>>> histograms_;
  std::vector<std::function<void()>> callbacks_;
};

// Content-Type of Serialize()'s output.
inline constexpr char kTextContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Exposition helpers, exposed for tests.
std::string EscapeLabelValue(const std::string& value);
std::string EscapeHelp(const std::string& help);
std::string FormatValue(double value);
bool IsValidMetricName(const std::string& name);
bool IsValidLabelName(const std::string& name);

// ---- template implementation ----

template <typename T>
template <typename... Args>
T& Family<T>::Add(const Labels& labels, Args&&... args) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = metrics_.find(labels);
  if (it != metrics_.end()) return *it->second;
  for (const auto& [k, v] : labels) {
    if (!IsValidLabelName(k) || (std::is_same_v<T, Histogram> && k == "le")) {
      std::fprintf(stderr, "metrics: invalid label name \"%s\" on %s\n", k.c_str(),
                   name_.c_str());
      std::abort();
    }
  }
  auto metric = std::make_unique<T>(std::forward<Args>(args)...);
  T& ref = *metric;
  metrics_.emplace(labels, std::move(metric));
  return ref;
}

template <typename T>
void Family<T>::ForEach(const std::function<void(const Labels&, const T&)>& f) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [labels, metric] : metrics_) {
    if (const_labels_.empty()) {
      f(labels, *metric);
    } else {
      Labels all = const_labels_;
      for (const auto& [k, v] : labels) all[k] = v;
      f(all, *metric);
    }
  }
}

}  // namespace rollpack::metrics

#endif  // ROLLPACK_SERVER_OPS_METRICS_REGISTRY_H_
