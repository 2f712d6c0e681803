#include "base/version.h"

// CMake writes the commit into its build folder on every build (a header
// that changes only when HEAD does); Bazel has none.
#ifdef ROLLPACK_HAVE_BUILD_COMMIT
#include "rollpack_build_commit.h"
#else
#define ROLLPACK_BUILD_COMMIT "unknown"
#endif

namespace rollpack {

const char* BuildCommit() { return ROLLPACK_BUILD_COMMIT; }

}  // namespace rollpack
