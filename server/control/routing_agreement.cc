#include "server/control/routing_agreement.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

// Counts come from clients: a sum that would overflow sticks at the maximum
// instead of wrapping (signed overflow is undefined).
int64_t SaturatingAdd(int64_t a, int64_t b) {
  if (b > 0 && a > std::numeric_limits<int64_t>::max() - b) {
    return std::numeric_limits<int64_t>::max();
  }
  return a + b;
}

// overlapping <= rows * topk without computing the product (it can
// overflow for rows near the per-report bound).
bool OverlapFits(int64_t overlapping, int64_t rows, int topk) {
  const int64_t per_row = overlapping / topk + (overlapping % topk != 0 ? 1 : 0);
  return per_row <= rows;
}

}  // namespace

absl::Status ValidateRoutingAgreementReport(const Step& step,
                                            const v1::RoutingAgreementReport& report) {
  const RankCoords coords{report.rank().dp(), report.rank().cp(), report.rank().tp(),
                          report.rank().pp()};
  RETURN_IF_ERROR(step.layout.ValidateCoords(coords));
  if (report.topk() != step.model.topk) {
    return absl::InvalidArgumentError(absl::StrCat("topk is ", report.topk(), ", but step \"",
                                                   step.step_id, "\"'s model has topk ",
                                                   step.model.topk));
  }
  if (report.layers_size() == 0) {
    return absl::InvalidArgumentError("layers is empty: report at least one MoE layer");
  }
  const std::vector<int>& replay = step.layout.pipeline().stage(coords.pp).replay_layers;
  // Every pass over one rank's rows sees at most max_tokens_per_rank rows per
  // micro-batch; more in one report means garbage or several passes merged.
  const int64_t num_mb = step.layout.num_microbatches();
  const int64_t max_tokens = step.topology.max_tokens_per_rank;
  const int64_t max_rows = max_tokens > std::numeric_limits<int64_t>::max() / num_mb
                               ? std::numeric_limits<int64_t>::max()
                               : num_mb * max_tokens;
  std::vector<int> seen;
  for (int i = 0; i < report.layers_size(); ++i) {
    const v1::LayerAgreement& l = report.layers(i);
    const std::string field = absl::StrCat("layers[", i, "]");
    if (!std::binary_search(replay.begin(), replay.end(), l.layer())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".layer is ", l.layer(), ", not a replay layer of pipeline stage pp=",
          coords.pp, " in step \"", step.step_id, "\" (its replay layers: [",
          absl::StrJoin(replay, ", "), "])"));
    }
    if (std::find(seen.begin(), seen.end(), l.layer()) != seen.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".layer ", l.layer(), " is listed twice"));
    }
    seen.push_back(l.layer());
    if (l.rows_compared() < 0 || l.rows_compared() > max_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".rows_compared is ", l.rows_compared(), ", outside [0, ", max_rows,
          "] (one pass over the rank's rows: num_microbatches ", step.layout.num_microbatches(),
          " * max_tokens_per_rank ", step.topology.max_tokens_per_rank, ")"));
    }
    if (l.rows_disagreeing() < 0 || l.rows_disagreeing() > l.rows_compared()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".rows_disagreeing is ", l.rows_disagreeing(), ", outside [0, ",
                       field, ".rows_compared = ", l.rows_compared(), "]"));
    }
    if (l.overlapping_experts() < 0 ||
        !OverlapFits(l.overlapping_experts(), l.rows_compared(), report.topk())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".overlapping_experts is ", l.overlapping_experts(), ", outside [0, ", field,
          ".rows_compared * topk = ", l.rows_compared(), " * ", report.topk(), "]"));
    }
  }
  return absl::OkStatus();
}

RoutingAgreementBook::RoutingAgreementBook(metrics::ScrapeRegistry* registry)
    : rows_compared_(registry->AddCounter(
          "rollpack_routing_rows_compared_total",
          "Router rows whose live top-K was compared with the replayed experts, reported by "
          "trainers, by global MoE layer.")),
      rows_disagreeing_(registry->AddCounter(
          "rollpack_routing_rows_disagreeing_total",
          "Compared router rows whose live top-K set differs from the replayed one, by global "
          "MoE layer.")),
      overlapping_experts_(registry->AddCounter(
          "rollpack_routing_overlapping_experts_total",
          "Sum over compared rows of |live top-K & replayed experts|, by global MoE layer "
          "(divide by rows compared * K for the mean overlap).")),
      last_step_disagreement_(registry->AddGauge(
          "rollpack_routing_last_step_disagreement_ratio",
          "Rows disagreeing / rows compared over every report (all ranks and layers) of the "
          "step that was first reported most recently.")),
      last_step_overlap_(registry->AddGauge(
          "rollpack_routing_last_step_mean_overlap_ratio",
          "Overlapping experts / (rows compared * K) of the step that was first reported most "
          "recently (1 = identical sets).")) {}

std::string RoutingAgreementBook::LayerLabel(int layer) {
  if (labelled_layers_.count(layer) == 0) {
    if (labelled_layers_.size() >= kMaxLayerLabels) return "other";
    labelled_layers_.insert(layer);
  }
  return absl::StrCat(layer);
}

void RoutingAgreementBook::SetLastStepGauges(const Totals& t) {
  if (t.rows_compared == 0) return;  // no ratio yet: leave the gauges as they are
  const double rows = static_cast<double>(t.rows_compared);
  last_step_disagreement_.Add({}).Set(static_cast<double>(t.rows_disagreeing) / rows);
  last_step_overlap_.Add({}).Set(static_cast<double>(t.overlapping_experts) / (rows * t.topk));
}

absl::StatusOr<v1::RoutingAgreementAck> RoutingAgreementBook::Record(
    const std::shared_ptr<const Step>& step, const v1::RoutingAgreementReport& report) {
  RETURN_IF_ERROR(ValidateRoutingAgreementReport(*step, report));
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(steps_.begin(), steps_.end(),
                         [&](const Totals& t) { return t.step.lock() == step; });
  if (it == steps_.end()) {
    Totals fresh;
    fresh.step = step;
    fresh.topk = step->model.topk;
    steps_.push_front(std::move(fresh));
    if (steps_.size() > kMaxSteps) steps_.pop_back();
    it = steps_.begin();
  }
  Totals& t = *it;
  for (const v1::LayerAgreement& l : report.layers()) {
    const metrics::Labels labels{{"layer", LayerLabel(l.layer())}};
    rows_compared_.Add(labels).Increment(static_cast<double>(l.rows_compared()));
    rows_disagreeing_.Add(labels).Increment(static_cast<double>(l.rows_disagreeing()));
    overlapping_experts_.Add(labels).Increment(static_cast<double>(l.overlapping_experts()));
    t.rows_compared = SaturatingAdd(t.rows_compared, l.rows_compared());
    t.rows_disagreeing = SaturatingAdd(t.rows_disagreeing, l.rows_disagreeing());
    t.overlapping_experts = SaturatingAdd(t.overlapping_experts, l.overlapping_experts());
  }
  ++t.reports;
  if (it == steps_.begin()) SetLastStepGauges(t);
  v1::RoutingAgreementAck ack;
  ack.set_step_rows_compared(t.rows_compared);
  ack.set_step_rows_disagreeing(t.rows_disagreeing);
  ack.set_step_overlapping_experts(t.overlapping_experts);
  ack.set_step_reports(t.reports);
  return ack;
}

}  // namespace rollpack
