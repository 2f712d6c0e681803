// The capture port's own endpoints, under /rollpack/ and never forwarded
// (shared/spec/capture.md): sealing a session (section 6) and rewards given
// later (section 6a). Answered on a record worker: both write durably.
#ifndef ROLLPACK_SERVER_CAPTURE_ROLLPACK_ENDPOINTS_H_
#define ROLLPACK_SERVER_CAPTURE_ROLLPACK_ENDPOINTS_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rollpack/v1/rollouts.pb.h"
#include "server/capture/capture_headers.h"
#include "server/capture/capture_recorder.h"

namespace rollpack {

// Rollouts.AnnotateSamples as the gRPC service serves it (in cluster mode
// any member's owners), so the HTTP form answers exactly as the RPC does.
using AnnotateFunction = std::function<absl::StatusOr<v1::AnnotateSamplesResponse>(
    const v1::AnnotateSamplesRequest&)>;

struct EndpointReply {
  // OK: `body` is the 200 answer. Otherwise the error (its code picks the
  // HTTP status) and `error_type` for the JSON error.
  absl::Status status;
  std::string body;
  std::string error_type;
  // What the call log says of it.
  std::string summary;
};

// POST /rollpack/v1/annotate's body: {"pool": P (optional), "annotations":
// [{"sample_id": ..., "scalars": {...}}, ...]}. The pool is the body's, else
// the X-Rollpack-Pool header's, else `default_pool`. INVALID_ARGUMENT naming
// what is malformed: not a JSON object, an unknown member, an annotation
// without a sample_id, a scalar that is not a finite number.
absl::StatusOr<v1::AnnotateSamplesRequest> ParseAnnotateBody(absl::string_view body,
                                                             const CaptureHeaders& headers,
                                                             const std::string& default_pool);

// Serves `method` `target` (a /rollpack/ path) with `body`. `annotate` may
// be empty (a server without the RPC): annotate then answers UNIMPLEMENTED.
EndpointReply ServeRollpackEndpoint(const CaptureRecorder& recorder,
                                    const AnnotateFunction& annotate, absl::string_view method,
                                    absl::string_view target, absl::string_view body,
                                    const CaptureHeaders& headers);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_ROLLPACK_ENDPOINTS_H_
