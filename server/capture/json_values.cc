#include "server/capture/json_values.h"

#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace rollpack {

std::string Quote(JsonValue& value) {
  absl::string_view token = absl::StripTrailingAsciiWhitespace(AbslView(value.raw_json_token()));
  // The parser gives a container's first byte only.
  if (absl::StartsWith(token, "[")) return "an array";
  if (absl::StartsWith(token, "{")) return "an object";
  constexpr size_t kMax = 40;
  if (token.size() > kMax) return absl::StrCat(token.substr(0, kMax), "...");
  return std::string(token);
}

absl::Status NotA(absl::string_view what, JsonValue& value, absl::string_view wanted) {
  return absl::InvalidArgumentError(absl::StrCat(what, " is ", Quote(value), ", not ", wanted));
}

absl::Status JsonError(absl::string_view what, simdjson::error_code error) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": not valid JSON (", simdjson::error_message(error), ")"));
}

absl::StatusOr<simdjson::ondemand::json_type> TypeOf(JsonValue& value, absl::string_view what) {
  simdjson::ondemand::json_type type;
  if (auto error = value.type().get(type)) return JsonError(what, error);
  return type;
}

bool IsNull(JsonValue& value) {
  simdjson::ondemand::json_type type;
  return !value.type().get(type) && type == simdjson::ondemand::json_type::null;
}

absl::StatusOr<bool> ReadBool(JsonValue& value, absl::string_view what) {
  bool out = false;
  if (value.get_bool().get(out)) return NotA(what, value, "true or false");
  return out;
}

absl::StatusOr<int64_t> ReadInt(JsonValue& value, absl::string_view what) {
  int64_t out = 0;
  if (value.get_int64().get(out)) return NotA(what, value, "an integer");
  return out;
}

absl::StatusOr<double> ReadNumber(JsonValue& value, absl::string_view what) {
  double out = 0;
  if (value.get_double().get(out)) return NotA(what, value, "a number");
  return out;
}

absl::StatusOr<std::string> ReadString(JsonValue& value, absl::string_view what) {
  std::string_view out;
  if (value.get_string().get(out)) return NotA(what, value, "a string");
  return std::string(out);
}

absl::StatusOr<std::vector<int32_t>> ReadTokenIds(JsonValue& value, absl::string_view what) {
  simdjson::ondemand::array array;
  if (value.get_array().get(array)) return NotA(what, value, "an array of token ids");
  std::vector<int32_t> ids;
  size_t i = 0;
  for (auto element : array) {
    JsonValue item;
    if (auto error = std::move(element).get(item))
      return JsonError(absl::StrCat(what, "[", i, "]"), error);
    int64_t id = 0;
    if (item.get_int64().get(id) || id < 0 || id > std::numeric_limits<int32_t>::max()) {
      return NotA(absl::StrCat(what, "[", i, "]"), item, "a token id");
    }
    ids.push_back(static_cast<int32_t>(id));
    ++i;
  }
  return ids;
}

}  // namespace rollpack
