// Routing-replay kernels, CUDA side: one include for callers, whatever they
// use (the declarations live with each operation, like the CPU side's in
// replay_kernels.h):
//   kernels/unpack_cuda.h     Unpack, UnpackPipelined (variants: bench/unpack_variants.h)
//   kernels/unpack_static_cuda.h  StaticUnpack, StoreRows (capturable in a CUDA graph)
//   kernels/apply_cuda.h      ApplyForward, ApplyBackward
//   kernels/agreement_cuda.h  AgreementFromLogits, AgreementFromIds
//   kernels/masked_logprob_cuda.h  MaskedLogprobForward, MaskedLogprobBackward
//
// Conventions of all of them: the same argument structs as the CPU versions,
// with every pointer in them a device pointer (mask too). `stream` is a
// cudaStream_t passed as void* (nullptr = the legacy default stream), so these
// headers need no CUDA include and bind easily from Python
// (torch.cuda.current_stream().cuda_stream). Every call is asynchronous on
// `stream`, validates shapes first (INVALID_ARGUMENT, nothing launched) and
// checks its launch with cudaGetLastError (INTERNAL with the CUDA error
// string). Kernel faults surface at the caller's next sync.
#ifndef ROLLPACK_KERNELS_REPLAY_KERNELS_CUDA_H_
#define ROLLPACK_KERNELS_REPLAY_KERNELS_CUDA_H_

#include "kernels/agreement_cuda.h"
#include "kernels/apply_cuda.h"
#include "kernels/masked_logprob_cuda.h"
#include "kernels/replay_kernels.h"
#include "kernels/unpack_cuda.h"
#include "kernels/unpack_static_cuda.h"

#endif  // ROLLPACK_KERNELS_REPLAY_KERNELS_CUDA_H_
