// Thin adapter from the kernels' absl-free KernelStatus to absl::Status, for
// the service code (the kernel libraries themselves do not depend on absl).
#pragma once

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
