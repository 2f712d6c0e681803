// Validation of an incoming sample's ragged per-token fields
// (Sample.ragged_token_fields, layout.md section 13), producing the store's
// form: values at ModelSpec::ragged_id_bytes() (uint16 or int32), offsets
// as int64. Called by sample_validation.cc; the pool's rule that all its
// samples carry the same names is the store's (it knows the pool).
#ifndef ROLLPACK_SERVER_INGEST_RAGGED_FIELD_VALIDATION_H_
#define ROLLPACK_SERVER_INGEST_RAGGED_FIELD_VALIDATION_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "rollpack/v1/rollouts.pb.h"
#include "scheduler/model_spec.h"
#include "server/store/pool_options.h"
#include "server/store/stored_sample.h"

namespace rollpack {

// The ragged field that holds the token ids the engine's sampler kept at
// each position (layout.md section 13): a set, each id at most once.
inline constexpr absl::string_view kSamplingMaskField = "sampling_mask";

// Every field of `sample.ragged_token_fields` into `*out`, by name.
// `num_tokens`: the message's tokens (a piece: its new ones), one list
// each. INVALID_ARGUMENT naming the sample (`who`, e.g. `sample "s1": `),
// the field and, for a bad offset or id, the token and the value: values
// not 1-D int32/int64/uint16, offsets not 1-D int32/int64 of num_tokens + 1
// entries from 0, decreasing, or not ending at len(values), an id < 0 or
// >= vocab_size (V > 0) or past int32 (V = 0), an empty or too long name,
// a name that is also one of the sample's or pool's (`declared`) dense
// token fields, or an id repeated within one token's list of
// `sampling_mask`. `owned` (null or the message itself, discarded afterwards):
// values already in the stored dtype are moved out of it, not copied.
// `growth_budget` (null: no bound) is charged what storing takes beyond
// what the message carried (uint16 ids widened, int32 offsets as int64).
absl::Status ConvertRaggedFields(const v1::Sample& sample, int64_t num_tokens,
                                 const ModelSpec& model,
                                 absl::Span<const DeclaredTokenField> declared,
                                 absl::string_view who, v1::Sample* owned,
                                 int64_t* growth_budget,
                                 std::map<std::string, StoredRagged>* out);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_RAGGED_FIELD_VALIDATION_H_
