// The one adapter from the kernels' absl-free KernelStatus to absl::Status,
// for the code that calls the kernels (client/trainer/); the kernel
// libraries themselves do not depend on absl.
#ifndef ROLLPACK_KERNELS_REPLAY_KERNELS_ABSL_H_
#define ROLLPACK_KERNELS_REPLAY_KERNELS_ABSL_H_

#include "absl/status/status.h"
#include "kernels/replay_kernels.h"

namespace rollpack::kernels {

inline absl::Status ToAbslStatus(const KernelStatus& s) {
  switch (s.code) {
    case StatusCode::kOk:
      return absl::OkStatus();
    case StatusCode::kInvalidArgument:
      return absl::InvalidArgumentError(s.message);
    case StatusCode::kInternal:
      return absl::InternalError(s.message);
  }
  return absl::UnknownError(s.message);
}

}  // namespace rollpack::kernels

#endif  // ROLLPACK_KERNELS_REPLAY_KERNELS_ABSL_H_
