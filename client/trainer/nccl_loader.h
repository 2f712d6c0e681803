// The part of NCCL's C ABI that TP-leader mode uses, declared here and
// resolved with dlopen at run time: building needs no NCCL, and the library
// uses the libnccl the trainer's torch already loaded
// ($ROLLPACK_NCCL_LIBRARY, which the Python client points at it), so two
// NCCL versions never meet in one process. CUDA builds only.
#ifndef ROLLPACK_CLIENT_TRAINER_NCCL_LOADER_H_
#define ROLLPACK_CLIENT_TRAINER_NCCL_LOADER_H_

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rollpack::trainer_internal {

// Layouts and values as in nccl.h (stable across NCCL 2.x).
typedef struct ncclComm* ncclComm_t;
struct ncclUniqueId {
  char internal[128];
};
constexpr int kNcclUint8 = 1;

struct Nccl {
  int (*GetUniqueId)(ncclUniqueId*) = nullptr;
  int (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  int (*CommDestroy)(ncclComm_t) = nullptr;
  int (*CommAbort)(ncclComm_t) = nullptr;
  int (*Broadcast)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*Send)(const void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*Recv)(void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*GroupStart)() = nullptr;
  int (*GroupEnd)() = nullptr;
  const char* (*GetErrorString)(int) = nullptr;
};

// $ROLLPACK_NCCL_LIBRARY, else libnccl.so.2; loaded once per process (the
// outcome, success or error, is kept).
absl::StatusOr<const Nccl*> LoadNccl();

// An NCCL result as a status, with NCCL's own words for it.
absl::Status NcclError(int result, const char* what);

#define RP_NCCL(expr)                                                             \
  do {                                                                            \
    int _r = (expr);                                                              \
    if (_r != 0) return ::rollpack::trainer_internal::NcclError(_r, #expr);       \
  } while (0)

}  // namespace rollpack::trainer_internal

#endif  // ROLLPACK_CLIENT_TRAINER_NCCL_LOADER_H_
