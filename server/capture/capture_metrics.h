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

// How a captured answer came: read whole (`body`), or as server-sent events
// whose final one carries the routing (`stream`: SGLang /generate, vLLM
// /inference/v1/generate with "stream": true). The overhead histogram's
// `mode` label.
enum class CaptureMode { kBody, kStream };

absl::string_view CaptureModeName(CaptureMode mode);

// Registered whether or not a capture port runs, so dashboards see zeros.
class CaptureMetrics {
 public:
  explicit CaptureMetrics(metrics::ScrapeRegistry& registry);

  // `endpoint`: EndpointName() of a captured endpoint, or "other".
  void OnRequest(absl::string_view endpoint, CaptureResult result);
  void OnStored(int64_t samples, int64_t stripped_bytes);
  // The engine's time and rollpackd's own on top of it, of one captured
  // request (section 8's overhead). A stream's own time is what it added to
  // the events' way: the request's rewrite, and the parse, strip and store
  // of each final event before it went on; not the engine's time between
  // events.
  void OnTimes(CaptureMode mode, double upstream_seconds, double overhead_seconds);

 private:
  metrics::Counter& Series(absl::string_view endpoint, CaptureResult result);

  metrics::Family<metrics::Counter>& requests_;
  metrics::Counter& samples_;
  metrics::Counter& stripped_bytes_;
  metrics::Histogram& upstream_seconds_;
  metrics::Family<metrics::Histogram>& overhead_seconds_;
  metrics::Histogram& body_overhead_seconds_;
  metrics::Histogram& stream_overhead_seconds_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_CAPTURE_METRICS_H_
