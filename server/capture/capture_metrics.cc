#include "server/capture/capture_metrics.h"

#include <string>

namespace rollpack {
namespace {

constexpr CaptureResult kResults[] = {CaptureResult::kStored, CaptureResult::kNotStored,
                                      CaptureResult::kPassthrough,
                                      CaptureResult::kUpstreamError};

// 50 us .. ~0.8 s: the target is 2 ms at p50 (capture.md section 8).
metrics::Histogram& OverheadSeries(metrics::Family<metrics::Histogram>& family,
                                   CaptureMode mode) {
  return family.Add({{"mode", std::string(CaptureModeName(mode))}},
                    metrics::ExponentialBuckets(5e-5, 2.0, 15));
}

}  // namespace

absl::string_view CaptureResultName(CaptureResult result) {
  switch (result) {
    case CaptureResult::kStored:
      return "stored";
    case CaptureResult::kNotStored:
      return "not_stored";
    case CaptureResult::kPassthrough:
      return "passthrough";
    case CaptureResult::kUpstreamError:
      return "upstream_error";
  }
  return "unknown";
}

absl::string_view CaptureModeName(CaptureMode mode) {
  return mode == CaptureMode::kStream ? "stream" : "body";
}

CaptureMetrics::CaptureMetrics(metrics::ScrapeRegistry& registry)
    : requests_(registry.AddCounter(
          "rollpack_capture_requests_total",
          "Requests on the capture port by endpoint (a captured one, or other) and result: "
          "stored, not_stored, passthrough (forwarded uncaptured), upstream_error.")),
      samples_(registry
                   .AddCounter("rollpack_capture_samples_total",
                               "Samples stored from the capture port (identical re-sends "
                               "excluded).")
                   .Add({})),
      stripped_bytes_(registry
                          .AddCounter("rollpack_capture_stripped_bytes_total",
                                      "Routing payload bytes removed from engine responses "
                                      "before they reached the client.")
                          .Add({})),
      // 100 us .. ~105 s: generation takes seconds to minutes.
      upstream_seconds_(registry
                            .AddHistogram("rollpack_capture_upstream_seconds",
                                          "The engine's time per captured request.")
                            .Add({}, metrics::ExponentialBuckets(1e-4, 2.0, 21))),
      // Summed over `mode` (sum by (le), as the dashboards do) it is the
      // series it was before the label.
      overhead_seconds_(registry.AddHistogram(
          "rollpack_capture_overhead_seconds",
          "rollpackd's own time per captured request, on top of the engine's; mode: body "
          "(the answer read whole) or stream (the parse, strip and store of each final "
          "event before it went on).")),
      body_overhead_seconds_(OverheadSeries(overhead_seconds_, CaptureMode::kBody)),
      stream_overhead_seconds_(OverheadSeries(overhead_seconds_, CaptureMode::kStream)) {
  // Every series exists from the first scrape, at zero.
  for (CaptureEndpoint endpoint :
       {CaptureEndpoint::kVllmCompletions, CaptureEndpoint::kVllmChat,
        CaptureEndpoint::kVllmGenerate, CaptureEndpoint::kSglangGenerate,
        CaptureEndpoint::kSglangChat, CaptureEndpoint::kSglangCompletions}) {
    for (CaptureResult result : kResults) Series(EndpointName(endpoint), result);
  }
  for (CaptureResult result : kResults) Series("other", result);
}

metrics::Counter& CaptureMetrics::Series(absl::string_view endpoint, CaptureResult result) {
  return requests_.Add({{"endpoint", std::string(endpoint)},
                        {"result", std::string(CaptureResultName(result))}});
}

void CaptureMetrics::OnRequest(absl::string_view endpoint, CaptureResult result) {
  Series(endpoint, result).Increment();
}

void CaptureMetrics::OnStored(int64_t samples, int64_t stripped_bytes) {
  samples_.Increment(static_cast<double>(samples));
  stripped_bytes_.Increment(static_cast<double>(stripped_bytes));
}

void CaptureMetrics::OnTimes(CaptureMode mode, double upstream_seconds,
                             double overhead_seconds) {
  upstream_seconds_.Observe(upstream_seconds);
  (mode == CaptureMode::kStream ? stream_overhead_seconds_ : body_overhead_seconds_)
      .Observe(overhead_seconds);
}

}  // namespace rollpack
