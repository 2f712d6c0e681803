// The X-Rollpack-* request headers of the capture port
// (shared/spec/capture.md section 2): what a rollout worker may say about
// the sample its request becomes. Every one is optional and none reaches
// the engine.
#ifndef ROLLPACK_SERVER_CAPTURE_CAPTURE_HEADERS_H_
#define ROLLPACK_SERVER_CAPTURE_CAPTURE_HEADERS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace rollpack {

struct CaptureHeaders {
  std::optional<std::string> pool;
  std::optional<std::string> sample_id;
  std::optional<std::string> group_id;
  std::optional<int32_t> group_size;
  int64_t policy_version = 0;
  std::optional<std::string> session;
  bool final_turn = false;
  std::optional<std::map<std::string, double>> scalars;
  std::optional<std::string> token;
};

using HeaderField = std::pair<absl::string_view, absl::string_view>;

// True for the headers rollpackd reads and removes before forwarding
// (any X-Rollpack-*, case-insensitively).
bool IsCaptureHeader(absl::string_view name);

// The capture headers among `fields` (names compared case-insensitively).
// INVALID_ARGUMENT naming the header and its value when one is malformed
// (section 2) or given twice: the proxy answers 400 before forwarding.
absl::StatusOr<CaptureHeaders> ParseCaptureHeaders(absl::Span<const HeaderField> fields);

// A JSON object of finite numbers (X-Rollpack-Scalars, the finish body's
// "scalars"), or INVALID_ARGUMENT naming `what` and the first bad member.
absl::StatusOr<std::map<std::string, double>> ParseScalarsJson(absl::string_view json,
                                                               absl::string_view what);

// POST /rollpack/v1/sessions/S/finish (section 6), as asked.
struct SessionFinishRequest {
  std::string pool;
  std::string session;
  std::optional<std::map<std::string, double>> scalars;
};

// `method` `target` with `body` (empty, or {"pool": ..., "scalars": {...}})
// and the request's capture headers: the pool is the body's, else the
// X-Rollpack-Pool header's, else `default_pool`; the scalars the body's,
// else the X-Rollpack-Scalars header's. NOT_FOUND for another
// /rollpack/... target; INVALID_ARGUMENT naming what is malformed.
absl::StatusOr<SessionFinishRequest> ParseSessionFinish(absl::string_view method,
                                                        absl::string_view target,
                                                        absl::string_view body,
                                                        const CaptureHeaders& headers,
                                                        const std::string& default_pool);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_CAPTURE_HEADERS_H_
