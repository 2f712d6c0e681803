#include "kernels/replay_kernels_absl.h"

#include <gtest/gtest.h>

namespace rollpack::kernels {
namespace {

TEST(ReplayKernelsAbsl, MapsCodes) {
  EXPECT_TRUE(ToAbslStatus(KernelStatus::Ok()).ok());
  absl::Status s = ToAbslStatus(KernelStatus::InvalidArgument("K must be in [1, 16]"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "K must be in [1, 16]");
  EXPECT_EQ(ToAbslStatus(KernelStatus::Internal("launch")).code(), absl::StatusCode::kInternal);
  UnpackArgs a;
  a.k = 0;
  EXPECT_EQ(ToAbslStatus(cpu::Unpack(a)).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rollpack::kernels
