#include "kernels/common.h"

#include <cmath>
#include <cstring>

namespace rollpack::kernels {

std::string KernelStatus::ToString() const {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT: " + message;
    case StatusCode::kInternal:
      return "INTERNAL: " + message;
  }
  return "UNKNOWN: " + message;
}

int IndexTypeSize(IndexType t) {
  switch (t) {
    case IndexType::kU8:
      return 1;
    case IndexType::kU16:
      return 2;
    case IndexType::kI32:
      return 4;
    case IndexType::kI64:
      return 8;
  }
  return 0;
}

float Bf16ToFloat(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

}  // namespace rollpack::kernels
