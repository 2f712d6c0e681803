// extern "C" shim over the CUDA kernels for the Python benchmarks (ctypes:
// bench/replay_bench.py, bench/masked_logprob_bench.py).
// Not the production binding (that is pybind11/torch, to come): just raw
// device pointers as integers, enums as ints, stream as void*. Each function
// returns the StatusCode (0 = OK); rp_last_error() gives the message.
#include <cstdint>
#include <string>

#include "kernels/bench/unpack_variants.h"
#include "kernels/replay_kernels_cuda.h"

using namespace rollpack::kernels;

namespace {
thread_local std::string g_err;
int Ret(const KernelStatus& s) {
  g_err = s.message;
  return int(s.code);
}
}  // namespace

extern "C" {

const char* rp_last_error() { return g_err.c_str(); }

int rp_unpack(const void* experts, int in_type, const uint8_t* mask, int64_t rows,
              int64_t layers, int k, void* out, int out_type, int64_t out_layer_stride,
              int fill, int variant, void* stream) {
  UnpackArgs a;
  a.experts = experts;
  a.in_type = IndexType(in_type);
  a.mask = mask;
  a.rows = rows;
  a.layers = layers;
  a.k = k;
  a.out = out;
  a.out_type = OutIndexType(out_type);
  a.out_layer_stride = out_layer_stride;
  a.masked_fill_minus_one = fill != 0;
  return Ret(cuda::UnpackWithVariant(a, cuda::UnpackVariant(variant), stream));
}

static ApplyArgs MakeApply(const void* logits, int logits_type, const void* ids, int ids_type,
                           int64_t ids_row_stride, int64_t rows, int e, int k, int score,
                           int renorm, float scale) {
  ApplyArgs a;
  a.logits = logits;
  a.logits_type = FloatType(logits_type);
  a.ids = {ids, IndexType(ids_type), ids_row_stride, 0};
  a.rows = rows;
  a.experts = e;
  a.k = k;
  a.score = ScoreFunction(score);
  a.renormalize = renorm != 0;
  a.scale = scale;
  return a;
}

int rp_apply_forward(const void* logits, int logits_type, const void* ids, int ids_type,
                     int64_t ids_row_stride, int64_t rows, int e, int k, int score, int renorm,
                     float scale, float* probs, uint8_t* routing_map, float* probs_dense,
                     void* stream) {
  return Ret(cuda::ApplyForward(
      MakeApply(logits, logits_type, ids, ids_type, ids_row_stride, rows, e, k, score, renorm, scale),
      {probs, routing_map, probs_dense}, stream));
}

int rp_apply_backward(const void* logits, int logits_type, const void* ids, int ids_type,
                      int64_t ids_row_stride, int64_t rows, int e, int k, int score, int renorm,
                      float scale, const float* grad_probs, void* grad_logits, void* stream) {
  return Ret(cuda::ApplyBackward(
      MakeApply(logits, logits_type, ids, ids_type, ids_row_stride, rows, e, k, score, renorm, scale),
      grad_probs, grad_logits, stream));
}

// stats: device int64[layers * 3] (rows_counted, rows_differ, overlap_sum).
int rp_agreement_logits(const void* logits, int logits_type, int64_t logits_layer_stride,
                        const void* replay, int replay_type, int64_t replay_row_stride,
                        int64_t replay_layer_stride, const uint8_t* mask, int64_t rows,
                        int64_t layers, int e, int k, void* stats, void* stream) {
  AgreementLogitsArgs a;
  a.logits = logits;
  a.logits_type = FloatType(logits_type);
  a.logits_layer_stride = logits_layer_stride;
  a.replay = {replay, IndexType(replay_type), replay_row_stride, replay_layer_stride};
  a.mask = mask;
  a.rows = rows;
  a.layers = layers;
  a.experts = e;
  a.k = k;
  return Ret(cuda::AgreementFromLogits(a, static_cast<AgreementStats*>(stats), stream));
}

int rp_agreement_ids(const void* live, int live_type, int64_t live_row_stride,
                     int64_t live_layer_stride, const void* replay, int replay_type,
                     int64_t replay_row_stride, int64_t replay_layer_stride, const uint8_t* mask,
                     int64_t rows, int64_t layers, int k, void* stats, void* stream) {
  AgreementIdsArgs a;
  a.live = {live, IndexType(live_type), live_row_stride, live_layer_stride};
  a.replay = {replay, IndexType(replay_type), replay_row_stride, replay_layer_stride};
  a.mask = mask;
  a.rows = rows;
  a.layers = layers;
  a.k = k;
  return Ret(cuda::AgreementFromIds(a, static_cast<AgreementStats*>(stats), stream));
}

// Masked log-probabilities (kernels/masked_logprob.h); lse is required here.
static MaskedLogprobArgs MakeMasked(const void* logits, int logits_type, int64_t rows,
                                    int64_t vocab, const void* values, int values_type,
                                    int64_t num_values, const void* offsets, int offsets_type,
                                    const void* targets, int targets_type) {
  MaskedLogprobArgs a;
  a.logits = logits;
  a.logits_type = FloatType(logits_type);
  a.rows = rows;
  a.vocab = vocab;
  a.values = values;
  a.values_type = IndexType(values_type);
  a.num_values = num_values;
  a.offsets = offsets;
  a.offsets_type = IndexType(offsets_type);
  a.targets = targets;
  a.targets_type = IndexType(targets_type);
  return a;
}

int rp_masked_logprob_forward(const void* logits, int logits_type, int64_t rows, int64_t vocab,
                              const void* values, int values_type, int64_t num_values,
                              const void* offsets, int offsets_type, const void* targets,
                              int targets_type, float* logprobs, float* lse, void* stream) {
  return Ret(cuda::MaskedLogprobForward(
      MakeMasked(logits, logits_type, rows, vocab, values, values_type, num_values, offsets,
                 offsets_type, targets, targets_type),
      logprobs, lse, stream));
}

int rp_masked_logprob_backward(const void* logits, int logits_type, int64_t rows, int64_t vocab,
                               const void* values, int values_type, int64_t num_values,
                               const void* offsets, int offsets_type, const void* targets,
                               int targets_type, const float* lse, const float* grad_logprobs,
                               const float* grad_lse, void* grad_logits, void* stream) {
  return Ret(cuda::MaskedLogprobBackward(
      MakeMasked(logits, logits_type, rows, vocab, values, values_type, num_values, offsets,
                 offsets_type, targets, targets_type),
      lse, grad_logprobs, grad_lse, grad_logits, stream));
}

}  // extern "C"
