// Typed reads of the values simdjson's on-demand parser walks, each refusal
// naming the field by its path ("choices[1].token_ids[3]") and quoting the
// value: a request or a response that is not what the endpoint takes is
// reported, not guessed at (shared/spec/capture.md sections 3 and 4).
#ifndef ROLLPACK_SERVER_CAPTURE_JSON_VALUES_H_
#define ROLLPACK_SERVER_CAPTURE_JSON_VALUES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "simdjson.h"

namespace rollpack {

using JsonValue = simdjson::ondemand::value;

// simdjson's std::string_view as an absl::string_view (not the same type
// where absl is built as C++14).
inline absl::string_view AbslView(std::string_view view) {
  return absl::string_view(view.data(), view.size());
}

// INVALID_ARGUMENT "`what` is <the value>, not <wanted>".
absl::Status NotA(absl::string_view what, JsonValue& value, absl::string_view wanted);
// INVALID_ARGUMENT naming `what` and simdjson's error.
absl::Status JsonError(absl::string_view what, simdjson::error_code error);

absl::StatusOr<simdjson::ondemand::json_type> TypeOf(JsonValue& value, absl::string_view what);
bool IsNull(JsonValue& value);

absl::StatusOr<bool> ReadBool(JsonValue& value, absl::string_view what);
absl::StatusOr<int64_t> ReadInt(JsonValue& value, absl::string_view what);
absl::StatusOr<double> ReadNumber(JsonValue& value, absl::string_view what);
absl::StatusOr<std::string> ReadString(JsonValue& value, absl::string_view what);

// An array of token ids (integers in [0, 2^31)).
absl::StatusOr<std::vector<int32_t>> ReadTokenIds(JsonValue& value, absl::string_view what);

// The value's JSON text, shortened for a message ("an array", "an object"
// for containers).
std::string Quote(JsonValue& value);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_JSON_VALUES_H_
