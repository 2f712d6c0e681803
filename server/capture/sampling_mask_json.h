// The sampling mask as the engines write it in JSON (shared/spec/capture.md
// section 3.1): the token ids the sampler kept (after top-k / top-p / min-p)
// at each generated position. vLLM: choices[i].sampling_mask; SGLang:
// meta_info.output_token_sampling_mask. Both write one list of ids per
// generated token; vLLM's first form, SamplingMask(token_ids, offsets), is
// read too, as an object of those two arrays.
#ifndef ROLLPACK_SERVER_CAPTURE_SAMPLING_MASK_JSON_H_
#define ROLLPACK_SERVER_CAPTURE_SAMPLING_MASK_JSON_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/capture/engine_exchange.h"
#include "server/capture/json_values.h"

namespace rollpack {

// The name of the ragged token field a captured sample stores it in.
inline constexpr absl::string_view kSamplingMaskField = "sampling_mask";

// Appends `from`'s lists after `to`'s (a stream's events, in order).
void AppendSamplingMask(const SamplingMaskLists& from, SamplingMaskLists& to);

// `value` (named `what` in errors) into `out`: null leaves it without lists;
// an array of arrays of token ids, or an object {"token_ids": [...],
// "offsets": [...]} whose offsets go from 0 up to len(token_ids) without
// decreasing. INVALID_ARGUMENT naming the element otherwise.
absl::Status ReadSamplingMask(JsonValue& value, absl::string_view what, SamplingMaskLists& out);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_SAMPLING_MASK_JSON_H_
