// Sequence-length files (shared/bench/*.txt) for `rollpack plan` and the
// plan benchmark.
#ifndef ROLLPACK_SCHEDULER_LENGTHS_FILE_H_
#define ROLLPACK_SCHEDULER_LENGTHS_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rollpack {

// One sequence length per line; blank lines and lines starting with '#' are
// skipped.
absl::StatusOr<std::vector<int64_t>> ReadLengthsFile(const std::string& path);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_LENGTHS_FILE_H_
