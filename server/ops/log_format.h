// How rollpackd's log lines look and which are written: --log-level and
// --log-format (text for people, json for log pipelines: one object per line
// with time, level, thread and the message, JSON-escaped).
#ifndef ROLLPACK_SERVER_OPS_LOG_FORMAT_H_
#define ROLLPACK_SERVER_OPS_LOG_FORMAT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rollpack {

// Configures spdlog's default logger. `level`: trace, debug, info, warning
// (or warn), error, off. `format`: text or json. INVALID_ARGUMENT names the
// value refused and the accepted ones.
absl::Status ConfigureLogging(absl::string_view level, absl::string_view format);

// `text` as the body of a JSON string (quotes, backslashes and control
// characters escaped; bytes of invalid UTF-8 replaced by U+FFFD).
std::string JsonEscape(absl::string_view text);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_LOG_FORMAT_H_
