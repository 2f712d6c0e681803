// Routing-replay kernels: shared types and the CPU reference implementation.
//
// Depends only on the C++ standard library, so that it builds where absl is
// missing (the GPU machine). kernels/replay_kernels_absl.h adapts KernelStatus
// to absl::Status; kernels/replay_kernels_cuda.h declares the CUDA versions,
// which take the same arguments plus a stream (a cudaStream_t passed as
// void*, nullptr = legacy default stream) and device pointers.
//
// Every function validates its sizes and returns INVALID_ARGUMENT (before
// touching any memory) on a bad shape; rows == 0 is valid and does nothing
// (agreement still writes its zero counts). Limits: 1 <= K <= 16 (kMaxK),
// K <= E <= 1024 (kMaxExperts) where E is an argument.
//
// ---------------------------------------------------------------------------
// 1. Unpack (Unpack): layout.md section 7 sends `replay_experts`
//    [rows, layers, K] (uint8 when E <= 256, else uint16, token-major) and
//    `replay_mask` uint8 [rows]. Unpack writes, in one pass over all layers,
//        out[l * out_layer_stride + r * K + k] = experts[(r * layers + l) * K + k]
//    as int64 or int32, i.e. x.permute(1, 0, 2).to(int64).contiguous() when
//    out_layer_stride == rows * K. out + l * out_layer_stride is then the
//    [rows, K] tensor that Megatron's RouterReplay.set_target_indices takes for
//    local layer l. Rows with mask 0 carry filler ids that the sender made
//    valid and distinct (layout.md section 7); they are COPIED THROUGH by
//    default, so the trainer can feed every row to the router unchanged. With
//    masked_fill_minus_one (and a non-null mask) those rows are written as -1
//    instead. mask may be null (= all ones). Ids are not range-checked here.
//
// 2. Apply (ApplyForward / ApplyBackward): live router logits x [rows, E]
//    (fp32 or bf16, row-contiguous; bf16 is computed in fp32 internally) and
//    replay ids i[r, k] (any IndexView type, so the unpacked int64/int32 tensor
//    or the received uint8/uint16 buffer directly).
//      s = softmax(x) over all E experts (kSoftmax) or sigmoid(x) (kSigmoid)
//      p_k = s[i_k]
//      renormalize: q_k = p_k / (sum_j p_j + eps), eps = 0 for softmax,
//                   1e-20 for sigmoid (as Megatron); else q_k = p_k
//      probs[r, k] = scale * q_k                                  (fp32 [rows, K])
//      routing_map[r, e] = 1 if e is one of the row's ids else 0   (uint8 [rows, E],
//                                                     torch.bool compatible)
//      probs_dense[r, e] = probs[r, k] at e = i_k, 0 elsewhere    (optional, fp32)
//    Softmax + renormalize is exactly Megatron's "top-k then softmax over the
//    K logits" path (moe_router_pre_softmax = False); softmax without it is the
//    pre-softmax path; sigmoid + renormalize is the DeepSeek-V3 path (an expert
//    bias only changes which experts are selected, and replay fixes those).
//    All rows are processed regardless of the mask (the caller decides which
//    ids to feed; unpack's filler ids are valid).
//    ApplyBackward: given g = d(loss)/d(probs) fp32 [rows, K], writes the exact
//    analytic d(loss)/d(x) [rows, E] (same dtype as x), through the
//    renormalization and the softmax normalization over all E. A repeated id in
//    a row contributes once per occurrence to the gradient (probs are then
//    per-occurrence; the map/dense outputs hold one entry). Ids outside [0, E):
//    the CPU version returns INVALID_ARGUMENT; the CUDA version never reads or
//    writes out of bounds and, for a row holding one, writes NaN probs, an
//    all-zero routing-map row, a NaN dense row and a NaN gradient row.
//
// 3. Agreement (AgreementFromLogits / AgreementFromIds): per layer, over rows
//    with mask 1 (all rows when mask is null):
//      live set  = top-K of the live logits (largest first, ties broken by the
//                  lower expert id; sigmoid is monotone, so the same set as for
//                  sigmoid scores), or the given live ids;
//      rows_differ   += set(live) != set(replay)   (as sets: order ignored)
//      overlap_sum   += |set(live) & set(replay)|
//    fraction_differ = rows_differ / rows_counted,
//    mean_overlap    = overlap_sum / (rows_counted * K)   (1.0 = identical).
//    Both are 0 when rows_counted == 0 (see AgreementStats helpers). For
//    routers whose selection is not a plain top-K of the logits (expert bias,
//    group-limited routing), pass the live ids.
// ---------------------------------------------------------------------------
#pragma once

#include <cstdint>
#include <string>

namespace rollpack::kernels {

inline constexpr int kMaxK = 16;
inline constexpr int kMaxExperts = 1024;

enum class StatusCode : int { kOk = 0, kInvalidArgument = 3, kInternal = 13 };

// A small status without absl (see replay_kernels_absl.h for the adapter).
struct KernelStatus {
  StatusCode code = StatusCode::kOk;
  std::string message;

  bool ok() const { return code == StatusCode::kOk; }
  static KernelStatus Ok() { return {}; }
  static KernelStatus InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static KernelStatus Internal(std::string m) {
    return {StatusCode::kInternal, std::move(m)};
  }
  std::string ToString() const;
};

enum class IndexType : int { kU8 = 0, kU16 = 1, kI32 = 2, kI64 = 3 };
enum class OutIndexType : int { kI32 = 2, kI64 = 3 };
enum class FloatType : int { kF32 = 0, kBF16 = 1 };  // bf16: raw uint16 bits
enum class ScoreFunction : int { kSoftmax = 0, kSigmoid = 1 };

int IndexTypeSize(IndexType t);

// Strided view of expert ids: id(l, r, k) = data[l * layer_stride +
// r * row_stride + k] (strides in elements). For the received buffer
// [rows, layers, K]: row_stride = layers * K, layer_stride = K. For unpacked
// [layers, rows, K]: row_stride = K, layer_stride = rows * K.
struct IndexView {
  const void* data = nullptr;
  IndexType type = IndexType::kI64;
  int64_t row_stride = 0;
  int64_t layer_stride = 0;
};

struct UnpackArgs {
  const void* experts = nullptr;   // [rows, layers, K]
  IndexType in_type = IndexType::kU8;  // kU8 or kU16 only
  const uint8_t* mask = nullptr;   // [rows] or null
  int64_t rows = 0;
  int64_t layers = 0;
  int k = 0;
  void* out = nullptr;             // layer l at out + l * out_layer_stride
  OutIndexType out_type = OutIndexType::kI64;
  int64_t out_layer_stride = -1;   // elements; -1 means rows * K
  bool masked_fill_minus_one = false;
};

struct ApplyArgs {
  const void* logits = nullptr;    // [rows, E]
  FloatType logits_type = FloatType::kF32;
  IndexView ids;                   // [rows, K] (layer_stride unused)
  int64_t rows = 0;
  int experts = 0;                 // E
  int k = 0;
  ScoreFunction score = ScoreFunction::kSoftmax;
  bool renormalize = false;
  float scale = 1.0f;
};

struct ApplyForwardOut {
  float* probs = nullptr;          // [rows, K], required
  uint8_t* routing_map = nullptr;  // [rows, E], optional
  float* probs_dense = nullptr;    // [rows, E], optional
};

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
KernelStatus ValidateUnpack(const UnpackArgs& a);
KernelStatus ValidateApply(const ApplyArgs& a);
KernelStatus ValidateAgreementLogits(const AgreementLogitsArgs& a);
KernelStatus ValidateAgreementIds(const AgreementIdsArgs& a);

// bf16 <-> float (round to nearest even), host side.
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);

namespace cpu {

KernelStatus Unpack(const UnpackArgs& a);
// Computes in float64, stores fp32.
KernelStatus ApplyForward(const ApplyArgs& a, const ApplyForwardOut& out);
// grad_probs fp32 [rows, K]; grad_logits [rows, E] of a.logits_type.
KernelStatus ApplyBackward(const ApplyArgs& a, const float* grad_probs,
                           void* grad_logits);
// stats: `layers` entries.
KernelStatus AgreementFromLogits(const AgreementLogitsArgs& a,
                                 AgreementStats* stats);
KernelStatus AgreementFromIds(const AgreementIdsArgs& a, AgreementStats* stats);

}  // namespace cpu
}  // namespace rollpack::kernels
