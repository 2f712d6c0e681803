// Agreement: how far the live router's selection is from the replayed one, per
// layer (the number CI gates on).
//
// Per layer, over rows with mask 1 (all rows when mask is null):
//   live set  = top-K of the live logits (largest first, ties broken by the
//               lower expert id; sigmoid is monotone, so the same set as for
//               sigmoid scores), or the given live ids;
//   rows_differ   += set(live) != set(replay)   (as sets: order ignored)
//   overlap_sum   += |set(live) & set(replay)|
// fraction_differ = rows_differ / rows_counted,
// mean_overlap    = overlap_sum / (rows_counted * K)   (1.0 = identical).
// Both are 0 when rows_counted == 0 (see the AgreementStats helpers). For
// routers whose selection is not a plain top-K of the logits (expert bias,
// group-limited routing), pass the live ids.
// Conventions shared with unpack and apply: common.h.
#ifndef ROLLPACK_KERNELS_AGREEMENT_H_
#define ROLLPACK_KERNELS_AGREEMENT_H_

#include <cstdint>

#include "kernels/common.h"

namespace rollpack::kernels {

// Per-layer counts. Written (not accumulated) by the agreement functions.
struct AgreementStats {
  int64_t rows_counted = 0;
  int64_t rows_differ = 0;
  int64_t overlap_sum = 0;
};
double FractionDiffer(const AgreementStats& s);
double MeanOverlap(const AgreementStats& s, int k);

struct AgreementLogitsArgs {
  const void* logits = nullptr;    // layer l: logits + l*logits_layer_stride, [rows, E]
  FloatType logits_type = FloatType::kF32;
  int64_t logits_layer_stride = -1;  // elements; -1 means rows * E
  IndexView replay;                // [layers][rows, K]
  const uint8_t* mask = nullptr;   // [rows] or null, shared by all layers
  int64_t rows = 0;
  int64_t layers = 1;
  int experts = 0;
  int k = 0;
};

struct AgreementIdsArgs {
  IndexView live;                  // [layers][rows, K]
  IndexView replay;                // [layers][rows, K]
  const uint8_t* mask = nullptr;
  int64_t rows = 0;
  int64_t layers = 1;
  int k = 0;
};

// Shape validation shared by the CPU and CUDA versions.
KernelStatus ValidateAgreementLogits(const AgreementLogitsArgs& a);
KernelStatus ValidateAgreementIds(const AgreementIdsArgs& a);

namespace cpu {

// stats: `layers` entries.
KernelStatus AgreementFromLogits(const AgreementLogitsArgs& a,
                                 AgreementStats* stats);
KernelStatus AgreementFromIds(const AgreementIdsArgs& a, AgreementStats* stats);

}  // namespace cpu
}  // namespace rollpack::kernels

#endif  // ROLLPACK_KERNELS_AGREEMENT_H_
