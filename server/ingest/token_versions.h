// Per-token policy versions (lifecycle.md section 3, "Per-token versions"):
// a rollout generated across weight updates (partial rollouts; vLLM's
// weight-version attribution) says which policy version produced each token
// in the token field `token_version`. Its staleness is its oldest token's:
// the sample's version becomes the lowest per-token version, so selection,
// drop_stale, the stale counts and Microbatch.policy_versions all judge it
// by the oldest weights that produced any of its tokens.
#ifndef ROLLPACK_SERVER_INGEST_TOKEN_VERSIONS_H_
#define ROLLPACK_SERVER_INGEST_TOKEN_VERSIONS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/store/stored_sample.h"

namespace rollpack {

// The token field that carries per-token policy versions.
inline constexpr absl::string_view kTokenVersionField = "token_version";

// With a `token_version` token field in `sample` (validated, one value per
// token): INVALID_ARGUMENT (prefixed by `who`) unless it is one integer per
// token; otherwise sets sample->policy_version to its lowest value >= 0
// (negative values: tokens no policy generated, such as the prompt's). A
// sample without the field, or with none >= 0, keeps its policy_version.
absl::Status ApplyTokenVersions(absl::string_view who, StoredSample* sample);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_TOKEN_VERSIONS_H_
