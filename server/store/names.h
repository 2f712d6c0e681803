// Limits on the names clients choose (pools, steps, samples): bounded in
// length and printable, so a name cannot grow memory, metric label sets or
// the error messages that quote it (a 10 MB unknown pool name was echoed
// into the status and refused by the client as RESOURCE_EXHAUSTED).
#ifndef ROLLPACK_SERVER_STORE_NAMES_H_
#define ROLLPACK_SERVER_STORE_NAMES_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rollpack {

inline constexpr size_t kMaxPoolNameBytes = 128;
inline constexpr size_t kMaxStepIdBytes = 128;
inline constexpr size_t kMaxSampleIdBytes = 1024;
inline constexpr size_t kMaxTokenFieldNameBytes = 128;
// A pool's required scalar names (PoolOptions.required_scalars).
inline constexpr size_t kMaxScalarNameBytes = 128;

// INVALID_ARGUMENT naming `what` ("pool name", "step_id", ...) when `name`
// is empty, longer than `max_bytes`, not UTF-8, or holds a control
// character. The name is quoted in the message only when it is valid.
absl::Status ValidateName(absl::string_view what, absl::string_view name, size_t max_bytes);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_NAMES_H_
