#include "client/trainer/masked_logprob_capi.h"

#include <string>

#include "kernels/masked_logprob.h"

#ifdef ROLLPACK_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/masked_logprob_cuda.h"
#endif

namespace k = rollpack::kernels;

namespace {

thread_local std::string g_error;

int Ret(const k::KernelStatus& s) {
  g_error = s.message;
  return static_cast<int>(s.code);
}

k::MaskedLogprobArgs MakeArgs(const void* logits, int logits_type, int64_t rows, int64_t vocab,
                              const void* values, int values_type, int64_t num_values,
                              const void* offsets, int offsets_type, const void* targets,
                              int targets_type) {
  k::MaskedLogprobArgs a;
  a.logits = logits;
  a.logits_type = k::FloatType(logits_type);
  a.rows = rows;
  a.vocab = vocab;
  a.values = values;
  a.values_type = k::IndexType(values_type);
  a.num_values = num_values;
  a.offsets = offsets;
  a.offsets_type = k::IndexType(offsets_type);
  a.targets = targets;
  a.targets_type = k::IndexType(targets_type);
  return a;
}

#ifdef ROLLPACK_WITH_CUDA
// The caller's current device, restored after the launch.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) cudaSetDevice(device);
    changed_ = prev_ != device;
  }
  ~OnDevice() {
    if (changed_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool changed_ = false;
};
#else
int NoCuda() {
  g_error = "librollpack_trainer was built without CUDA";
  return static_cast<int>(k::StatusCode::kInvalidArgument);
}
#endif

}  // namespace

extern "C" {

const char* rpt_masked_logprob_last_error(void) { return g_error.c_str(); }

int rpt_masked_logprob_forward(int device, const void* logits, int logits_type, int64_t rows,
                               int64_t vocab, const void* values, int values_type,
                               int64_t num_values, const void* offsets, int offsets_type,
                               const void* targets, int targets_type, float* logprobs,
                               float* lse, void* stream) {
  const k::MaskedLogprobArgs a = MakeArgs(logits, logits_type, rows, vocab, values, values_type,
                                          num_values, offsets, offsets_type, targets,
                                          targets_type);
  if (device < 0) return Ret(k::cpu::MaskedLogprobForward(a, logprobs, lse));
#ifdef ROLLPACK_WITH_CUDA
  OnDevice on(device);
  return Ret(k::cuda::MaskedLogprobForward(a, logprobs, lse, stream));
#else
  return NoCuda();
#endif
}

int rpt_masked_logprob_backward(int device, const void* logits, int logits_type, int64_t rows,
                                int64_t vocab, const void* values, int values_type,
                                int64_t num_values, const void* offsets, int offsets_type,
                                const void* targets, int targets_type, const float* lse,
                                const float* grad_logprobs, const float* grad_lse,
                                void* grad_logits, void* stream) {
  const k::MaskedLogprobArgs a = MakeArgs(logits, logits_type, rows, vocab, values, values_type,
                                          num_values, offsets, offsets_type, targets,
                                          targets_type);
  if (device < 0)
    return Ret(k::cpu::MaskedLogprobBackward(a, lse, grad_logprobs, grad_lse, grad_logits));
#ifdef ROLLPACK_WITH_CUDA
  OnDevice on(device);
  return Ret(k::cuda::MaskedLogprobBackward(a, lse, grad_logprobs, grad_lse, grad_logits,
                                            stream));
#else
  return NoCuda();
#endif
}

}  // extern "C"
