// The capture port's Prometheus metrics (shared/spec/capture.md section 7).
#ifndef ROLLPACK_SERVER_CAPTURE_CAPTURE_METRICS_H_
#define ROLLPACK_SERVER_CAPTURE_CAPTURE_METRICS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "server/capture/engine_exchange.h"
#include "server/ops/metrics/scrape_registry.h"

namespace rollpack {

enum class CaptureResult { kStored, kNotStored, kPassthrough, kUpstreamError };

absl::string_view CaptureResultName(CaptureResult result);

// Registered whether or not a capture port runs, so dashboards see zeros.
class CaptureMetrics {
 public:
  explicit CaptureMetrics(metrics::ScrapeRegistry& registry);

  // `endpoint`: EndpointName() of a captured endpoint, or "other".
  void OnRequest(absl::string_view endpoint, CaptureResult result);
  void OnStored(int64_t samples, int64_t stripped_bytes);
  // The engine's time and rollpackd's own on top of it, of one captured
  // request (section 8's overhead).
  void OnTimes(double upstream_seconds, double overhead_seconds);

 private:
  metrics::Counter& Series(absl::string_view endpoint, CaptureResult result);

  metrics::Family<metrics::Counter>& requests_;
  metrics::Counter& samples_;
  metrics::Counter& stripped_bytes_;
  metrics::Histogram& upstream_seconds_;
  metrics::Histogram& overhead_seconds_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_CAPTURE_METRICS_H_
