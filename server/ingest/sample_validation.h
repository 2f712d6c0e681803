// Full validation of one incoming sample against its pool's model
// (layout.md sections 1 and 10: MTP layers' routing after the decoder's with
// mtp_routing), producing the store's normalised form [n, |M| + D, K].
// Nothing is stored unless this succeeds.
#ifndef ROLLPACK_SERVER_INGEST_SAMPLE_VALIDATION_H_
#define ROLLPACK_SERVER_INGEST_SAMPLE_VALIDATION_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "rollpack/v1/rollouts.pb.h"
#include "scheduler/model_spec.h"
#include "server/store/pool_options.h"
#include "server/store/stored_sample.h"

namespace rollpack {

// INVALID_ARGUMENT with a message that names the sample, the field and the
// numbers, e.g. `sample "s17": routed_experts has 4095 rows from offset 0,
// must end at n = 4097 or n - 1 = 4096`. Checks the arrays' dtypes, shapes
// and byte lengths, the row range, the layer axis (full or compact), expert
// ids, missing rows, duplicate ids, all-zero MoE layers, and token fields'
// first dimension. Consistency of token fields across a pool is the store's
// job (it knows the pool).
//
// `declared`: the pool's declared token fields (PoolOptions.token_fields);
// a field sent in another dtype is converted into the declared one where
// token_field_conversion.h allows it. `growth_budget` (null: no bound) is
// the bytes widening conversions may still add; each one takes its share,
// and one past it is INVALID_ARGUMENT.
absl::StatusOr<StoredSample> ValidateSample(const v1::Sample& sample, const ModelSpec& model,
                                            absl::Span<const DeclaredTokenField> declared = {},
                                            int64_t* growth_budget = nullptr);

// The same checks and result, but payload bytes that need no conversion are
// moved out of `*sample` instead of copied (ingest's path: the request is
// discarded afterwards). On error `*sample` may have lost payload bytes.
absl::StatusOr<StoredSample> ValidateAndTakeSample(
    v1::Sample* sample, const ModelSpec& model,
    absl::Span<const DeclaredTokenField> declared = {}, int64_t* growth_budget = nullptr);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_SAMPLE_VALIDATION_H_
