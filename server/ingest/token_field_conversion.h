// Converts a token field sent in one numeric dtype into the dtype its pool
// declared (PoolOptions.token_fields), where that is exact, so producers need
// not match the pool's dtype byte for byte (a bool or int64 loss mask into a
// uint8 field, an int mask into float32, float16 logprobs into float32):
//
//   into uint8 .. int64   from any integer dtype, when every value fits;
//   into float32          from an integer dtype when |value| <= 2^24,
//                         from float16 and bfloat16 (always exact),
//                         from float64 only with allow_narrowing (rounded
//                         to nearest; a finite value that overflows is refused);
//   into float16/bfloat16 from the same dtype only.
//
// Anything else is refused naming the field, the dtypes and, for a value
// that does not fit, the token and the value.
#ifndef ROLLPACK_SERVER_INGEST_TOKEN_FIELD_CONVERSION_H_
#define ROLLPACK_SERVER_INGEST_TOKEN_FIELD_CONVERSION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/store/ndarray.h"
#include "server/store/pool_options.h"

namespace rollpack {

// `view`'s elements in `declared.dtype` (little-endian bytes). `what` names
// the field in errors (`sample "s1": token_fields["loss_mask"]`);
// `per_token` is the number of elements per token (to name the token).
// Call only when view.dtype != declared.dtype.
absl::StatusOr<std::string> ConvertTokenField(const ArrayView& view,
                                              const DeclaredTokenField& declared,
                                              absl::string_view what, int64_t per_token);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_TOKEN_FIELD_CONVERSION_H_
