// How the packer may form CP groups (packing.h, packer.h). Internal to the
// scheduler library.
#ifndef ROLLPACK_SCHEDULER_PACK_OPTIONS_H_
#define ROLLPACK_SCHEDULER_PACK_OPTIONS_H_

#include <vector>

namespace rollpack {
namespace internal {

struct PackOptions {
  // Every bin's width is unit_width << k, at most max_width: dynamic CP's
  // powers of two from min_cp, or static CP's cp (any size).
  int unit_width = 1;
  int max_width = 1;
  // Smallest width each sequence fits on (>= unit_width, <= max_width).
  std::vector<int> min_width;
  // Dynamic CP: a sequence whose work alone exceeds a rank slot's average
  // may run on a larger group than it needs.
  bool allow_widening = false;
};

}  // namespace internal
}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_PACK_OPTIONS_H_
