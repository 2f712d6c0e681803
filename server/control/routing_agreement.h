// Routing agreement reported by trainer ranks (Telemetry.ReportRoutingAgreement,
// proto/rollpack/v1/telemetry.proto): each report is checked against its
// step, its counts are summed exactly across ranks, and the sums are exported
// as Prometheus metrics whose only label is the global MoE layer id (bounded
// by the models' layers, never by steps or ranks).
#ifndef ROLLPACK_SERVER_CONTROL_ROUTING_AGREEMENT_H_
#define ROLLPACK_SERVER_CONTROL_ROUTING_AGREEMENT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "rollpack/v1/telemetry.pb.h"
#include "server/ops/metrics/scrape_registry.h"
#include "server/store/step.h"

namespace rollpack {

// OK when `report` fits `step`; else INVALID_ARGUMENT naming the field and
// its value: rank coordinates outside the topology; topk other than the
// model's; no layers; a layer that is not a replay layer of the rank's
// pipeline stage, or listed twice; a negative count; rows_disagreeing above
// rows_compared; overlapping_experts above rows_compared * topk;
// rows_compared above one pass over the rank's rows (num_microbatches *
// max_tokens_per_rank).
absl::Status ValidateRoutingAgreementReport(const Step& step,
                                            const v1::RoutingAgreementReport& report);

class RoutingAgreementBook {
 public:
  // Registers the rollpack_routing_* families in `registry`, which must
  // outlive this object.
  explicit RoutingAgreementBook(metrics::ScrapeRegistry* registry);

  // Validates (ValidateRoutingAgreementReport), adds the counts and returns
  // the step's totals so far. `step` must not be null.
  absl::StatusOr<v1::RoutingAgreementAck> Record(const std::shared_ptr<const Step>& step,
                                                 const v1::RoutingAgreementReport& report);

  // Steps whose totals are kept (most recent first reports); older ones are
  // forgotten, so a report to a forgotten step starts its totals anew.
  static constexpr size_t kMaxSteps = 64;
  // Distinct `layer` label values; layers past it share layer="other".
  static constexpr size_t kMaxLayerLabels = 1024;

 private:
  struct Totals {
    // Identity, not the id: a step released and created again under the
    // same id starts from zero.
    std::weak_ptr<const Step> step;
    int topk = 0;
    int64_t rows_compared = 0;
    int64_t rows_disagreeing = 0;
    int64_t overlapping_experts = 0;
    int64_t reports = 0;
  };

  std::string LayerLabel(int layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetLastStepGauges(const Totals& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  metrics::Family<metrics::Counter>& rows_compared_;
  metrics::Family<metrics::Counter>& rows_disagreeing_;
  metrics::Family<metrics::Counter>& overlapping_experts_;
  metrics::Family<metrics::Gauge>& last_step_disagreement_;
  metrics::Family<metrics::Gauge>& last_step_overlap_;

  absl::Mutex mu_;
  // Front = the step whose first report came last: the one the
  // rollpack_routing_last_step_* gauges show, so stragglers of an older step
  // add to its totals without making the gauges jump back to it.
  std::deque<Totals> steps_ ABSL_GUARDED_BY(mu_);
  std::set<int> labelled_layers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CONTROL_ROUTING_AGREEMENT_H_
