/* C ABI of the masked log-probabilities (kernels/masked_logprob.h: the
 * sampled token's log-probability under the engine's sampling mask, and its
 * gradient), part of librollpack_trainer.so beside trainer_capi.h, bound by
 * rollpack/sampling_mask.py.
 *
 * device < 0: the CPU reference on host pointers (every row checked); else
 * the CUDA kernels on that device's pointers, asynchronous on `stream` (a
 * cudaStream_t; NULL = the legacy default stream). Type codes: logits 0 = f32,
 * 1 = bf16; values 1 = uint16, 2 = int32, 3 = int64; offsets and targets
 * 2 = int32, 3 = int64. Each returns 0 or a status code, the message in
 * rpt_masked_logprob_last_error() (per thread; its own, since these calls
 * share no state with the stream functions). Optional symbols: a library
 * without them is older, and the Python binding then computes in torch. */
#ifndef ROLLPACK_CLIENT_TRAINER_MASKED_LOGPROB_CAPI_H_
#define ROLLPACK_CLIENT_TRAINER_MASKED_LOGPROB_CAPI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

const char* rpt_masked_logprob_last_error(void);
/* logprobs fp32 [rows], required; lse fp32 [rows], NULL = not wanted. */
int rpt_masked_logprob_forward(int device, const void* logits, int logits_type, int64_t rows,
                               int64_t vocab, const void* values, int values_type,
                               int64_t num_values, const void* offsets, int offsets_type,
                               const void* targets, int targets_type, float* logprobs,
                               float* lse, void* stream);
/* lse: the forward's; grad_lse NULL = 0; grad_logits [rows, vocab] of the
 * logits' type, every element written. */
int rpt_masked_logprob_backward(int device, const void* logits, int logits_type, int64_t rows,
                                int64_t vocab, const void* values, int values_type,
                                int64_t num_values, const void* offsets, int offsets_type,
                                const void* targets, int targets_type, const float* lse,
                                const float* grad_logprobs, const float* grad_lse,
                                void* grad_logits, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* ROLLPACK_CLIENT_TRAINER_MASKED_LOGPROB_CAPI_H_ */
