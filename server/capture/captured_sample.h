// The sample a captured choice becomes (shared/spec/capture.md section 5):
// the engine's tokens, routing rows, loss mask, logprobs and sampling mask
// (the ragged token field sampling_mask) in the form a producer would have
// put them, so that PutSamples' validation and the store see nothing new.
#ifndef ROLLPACK_SERVER_CAPTURE_CAPTURED_SAMPLE_H_
#define ROLLPACK_SERVER_CAPTURE_CAPTURED_SAMPLE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "rollpack/v1/rollouts.pb.h"
#include "scheduler/model_spec.h"
#include "server/capture/engine_exchange.h"

namespace rollpack {

// Who the sample is: section 2's headers resolved, and for a session turn
// (section 6) which piece it is and where it starts.
struct CapturedIdentity {
  std::string sample_id;
  std::string group_id;
  int32_t group_size = 0;
  int64_t policy_version = 0;
  std::map<std::string, double> scalars;
  bool partial = false;
  int32_t piece = 0;
  // Tokens of the sample already stored: the piece holds the choice's
  // tokens from here on (0 for a whole sample).
  int64_t stored_tokens = 0;
};

// `choice` of `engine` as a Sample, its routing asked from `start_offset`
// (section 3: rows then start there, or at 0 from a build that ignored it).
// INVALID_ARGUMENT naming the sample and the field when the choice is
// unusable, its routing is not base64 of a payload the model's shape
// allows, its logprobs or sampling mask lists do not match its generated
// tokens, or it has fewer tokens than `stored_tokens`. Validation against
// the pool is still the caller's (ValidateAndTakeSample), as for PutSamples.
absl::StatusOr<v1::Sample> CapturedSample(Engine engine, const EngineChoice& choice,
                                          const ModelSpec& model, int64_t start_offset,
                                          const CapturedIdentity& identity);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_CAPTURED_SAMPLE_H_
