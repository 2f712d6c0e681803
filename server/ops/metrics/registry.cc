#include "server/ops/metrics/registry.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace rollpack::metrics {
namespace {

void AtomicAdd(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

void AppendLabels(std::string& out, const Labels& labels, const std::string* le = nullptr) {
  if (labels.empty() && le == nullptr) return;
  out += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    out += EscapeLabelValue(v);
    out += '"';
  }
  if (le != nullptr) {
    if (!first) out += ',';
    out += "le=\"";
    out += *le;
    out += '"';
  }
  out += '}';
}

void AppendSample(std::string& out, const std::string& name, const Labels& labels, double value,
                  const std::string* le = nullptr) {
  out += name;
  AppendLabels(out, labels, le);
  out += ' ';
  out += FormatValue(value);
  out += '\n';
}

void AppendHeader(std::string& out, const std::string& name, const std::string& help,
                  const char* type) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += EscapeHelp(help);
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

}  // namespace

void Counter::Increment(double v) {
  if (!(v >= 0)) return;  // also drops NaN
  AtomicAdd(value_, v);
}

void Gauge::Increment(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(BucketBoundaries bounds)
    : bounds_(std::move(bounds)),
      counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && !(bounds_[i] > bounds_[i - 1]))) {
      std::fprintf(stderr, "metrics: histogram bounds must be finite and increasing\n");
      std::abort();
    }
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double v) {
  // Bucket i counts bounds_[i-1] < v <= bounds_[i]; the last one is +Inf.
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

Histogram::BucketBoundaries Histogram::ExponentialBuckets(double start, double factor,
                                                          int count) {
  BucketBoundaries b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[32];
  // Integers (counts, bytes) print exactly and without an exponent.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    std::snprintf(buf, sizeof(buf), "%.0f", value);
  } else {
    // Shortest of %.15g..%.17g that reads back exactly (0.005, not
    // 0.0050000000000000001).
    for (int precision = 15; precision <= 17; ++precision) {
      std::snprintf(buf, sizeof(buf), "%.*g", precision, value);
      if (std::strtod(buf, nullptr) == value) break;
    }
  }
  return buf;
}

static bool ValidName(const std::string& name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                       (allow_colon && c == ':');
    const bool digit = c >= '0' && c <= '9';
    if (!(alpha || (i > 0 && digit))) return false;
  }
  return true;
}

bool IsValidMetricName(const std::string& name) { return ValidName(name, true); }

bool IsValidLabelName(const std::string& name) {
  return ValidName(name, false) && name.rfind("__", 0) != 0;
}

void Registry::CheckName(const std::string& name) {
  bool ok = IsValidMetricName(name);
  for (const auto& f : counters_) ok = ok && f->name() != name;
  for (const auto& f : gauges_) ok = ok && f->name() != name;
  for (const auto& f : histograms_) ok = ok && f->name() != name;
  if (!ok) {
    std::fprintf(stderr, "metrics: invalid or duplicate metric name \"%s\"\n", name.c_str());
    std::abort();
  }
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      const Labels& const_labels) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckName(name);
  counters_.push_back(std::make_unique<Family<Counter>>(name, help, const_labels));
  entries_.push_back({MetricType::kCounter, counters_.back().get()});
  return *counters_.back();
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  const Labels& const_labels) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckName(name);
  gauges_.push_back(std::make_unique<Family<Gauge>>(name, help, const_labels));
  entries_.push_back({MetricType::kGauge, gauges_.back().get()});
  return *gauges_.back();
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          const Labels& const_labels) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckName(name);
  histograms_.push_back(std::make_unique<Family<Histogram>>(name, help, const_labels));
  entries_.push_back({MetricType::kHistogram, histograms_.back().get()});
  return *histograms_.back();
}

void Registry::AddCollectCallback(std::function<void()> callback) {
  std::lock_guard<std::mutex> lock(mu_);
  callbacks_.push_back(std::move(callback));
}

std::string Registry::Serialize() const {
  std::vector<std::function<void()>> callbacks;
  std::vector<Entry> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    callbacks = callbacks_;
    entries = entries_;
  }
  for (const auto& cb : callbacks) cb();
  std::string out;
  for (const Entry& e : entries) {
    switch (e.type) {
      case MetricType::kCounter: {
        const auto& f = *static_cast<const Family<Counter>*>(e.family);
        AppendHeader(out, f.name(), f.help(), "counter");
        f.ForEach([&](const Labels& l, const Counter& c) {
          AppendSample(out, f.name(), l, c.Value());
        });
        break;
      }
      case MetricType::kGauge: {
        const auto& f = *static_cast<const Family<Gauge>*>(e.family);
        AppendHeader(out, f.name(), f.help(), "gauge");
        f.ForEach([&](const Labels& l, const Gauge& g) {
          AppendSample(out, f.name(), l, g.Value());
        });
        break;
      }
      case MetricType::kHistogram: {
        const auto& f = *static_cast<const Family<Histogram>*>(e.family);
        AppendHeader(out, f.name(), f.help(), "histogram");
        f.ForEach([&](const Labels& l, const Histogram& h) {
          const Histogram::Snapshot s = h.Collect();
          const std::string bucket = f.name() + "_bucket";
          for (size_t i = 0; i < s.bounds.size(); ++i) {
            const std::string le = FormatValue(s.bounds[i]);
            AppendSample(out, bucket, l, static_cast<double>(s.cumulative[i]), &le);
          }
          const std::string inf = "+Inf";
          AppendSample(out, bucket, l, static_cast<double>(s.count), &inf);
          AppendSample(out, f.name() + "_sum", l, s.sum);
          AppendSample(out, f.name() + "_count", l, static_cast<double>(s.count));
        });
        break;
      }
    }
  }
  return out;
}

}  // namespace rollpack::metrics
