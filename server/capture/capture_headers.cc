#include "server/capture/capture_headers.h"

#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "simdjson.h"

namespace rollpack {
namespace {

constexpr absl::string_view kPrefix = "x-rollpack-";

absl::Status Malformed(absl::string_view header, absl::string_view value,
                       absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("header X-Rollpack-", header, ": \"",
                                                 absl::CEscape(value), "\" ", why));
}

absl::StatusOr<std::string> NonEmpty(absl::string_view header, absl::string_view value) {
  if (value.empty()) return Malformed(header, value, "is empty");
  return std::string(value);
}

}  // namespace

bool IsCaptureHeader(absl::string_view name) {
  return name.size() >= kPrefix.size() &&
         absl::EqualsIgnoreCase(name.substr(0, kPrefix.size()), kPrefix);
}

absl::StatusOr<std::map<std::string, double>> ParseScalarsJson(absl::string_view json,
                                                               absl::string_view what) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json.data(), json.size());
  simdjson::dom::element root;
  if (auto error = parser.parse(padded).get(root); error) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not JSON: ", simdjson::error_message(error)));
  }
  simdjson::dom::object object;
  if (root.get(object) != simdjson::SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a JSON object"));
  }
  std::map<std::string, double> scalars;
  for (auto [raw_key, value] : object) {
    const absl::string_view key(raw_key.data(), raw_key.size());
    double number;
    if (value.get_double().get(number) != simdjson::SUCCESS || !std::isfinite(number)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": \"", key, "\" is not a finite number"));
    }
    if (!scalars.emplace(std::string(key), number).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": \"", key, "\" given twice"));
    }
  }
  return scalars;
}

absl::StatusOr<CaptureHeaders> ParseCaptureHeaders(absl::Span<const HeaderField> fields) {
  CaptureHeaders headers;
  std::map<std::string, bool> seen;
  for (const auto& [raw_name, raw_value] : fields) {
    if (!IsCaptureHeader(raw_name)) continue;
    const std::string name = absl::AsciiStrToLower(raw_name.substr(kPrefix.size()));
    const absl::string_view value = absl::StripAsciiWhitespace(raw_value);
    if (!seen.emplace(name, true).second) {
      return Malformed(raw_name.substr(kPrefix.size()), value, "is given twice");
    }
    const absl::string_view header = raw_name.substr(kPrefix.size());
    if (name == "pool") {
      ASSIGN_OR_RETURN(headers.pool, NonEmpty(header, value));
    } else if (name == "sample-id") {
      ASSIGN_OR_RETURN(headers.sample_id, NonEmpty(header, value));
    } else if (name == "group-id") {
      ASSIGN_OR_RETURN(headers.group_id, NonEmpty(header, value));
    } else if (name == "session") {
      ASSIGN_OR_RETURN(headers.session, NonEmpty(header, value));
    } else if (name == "group-size") {
      int64_t size;
      if (!absl::SimpleAtoi(value, &size) || size < 0 ||
          size > std::numeric_limits<int32_t>::max() ||
          absl::StrCat(size) != absl::StripPrefix(value, "+")) {
        return Malformed(header, value, "is not an integer from 0 to 2147483647");
      }
      headers.group_size = static_cast<int32_t>(size);
    } else if (name == "policy-version") {
      if (!absl::SimpleAtoi(value, &headers.policy_version) ||
          absl::StrCat(headers.policy_version) != absl::StripPrefix(value, "+")) {
        return Malformed(header, value, "is not a decimal int64");
      }
    } else if (name == "final") {
      if (value == "true") {
        headers.final_turn = true;
      } else if (value != "false") {
        return Malformed(header, value, "is neither true nor false");
      }
    } else if (name == "scalars") {
      auto scalars = ParseScalarsJson(value, "header X-Rollpack-Scalars");
      if (!scalars.ok()) return scalars.status();
      headers.scalars = *std::move(scalars);
    } else if (name == "token") {
      headers.token = std::string(value);
    }
    // Other X-Rollpack-* names are removed before forwarding and otherwise
    // ignored, so a newer client's headers reach an older rollpackd safely.
  }
  return headers;
}

absl::StatusOr<SessionFinishRequest> ParseSessionFinish(absl::string_view method,
                                                        absl::string_view target,
                                                        absl::string_view body,
                                                        const CaptureHeaders& headers,
                                                        const std::string& default_pool) {
  absl::string_view session = target.substr(0, target.find('?'));
  if (method != "POST" || !absl::ConsumePrefix(&session, "/rollpack/v1/sessions/") ||
      !absl::ConsumeSuffix(&session, "/finish") || session.empty() ||
      absl::StrContains(session, "/")) {
    return absl::NotFoundError(absl::StrCat("no rollpack endpoint ", method, " ", target,
                                            " (POST /rollpack/v1/sessions/S/finish, POST /rollpack/v1/annotate)"));
  }
  SessionFinishRequest finish;
  finish.session = std::string(session);
  finish.pool = headers.pool.value_or(default_pool);
  finish.scalars = headers.scalars;
  if (absl::StripAsciiWhitespace(body).empty()) return finish;
  simdjson::dom::parser parser;
  simdjson::padded_string padded(body.data(), body.size());
  simdjson::dom::object object;
  if (parser.parse(padded).get(object) != simdjson::SUCCESS) {
    return absl::InvalidArgumentError("the finish body is not a JSON object");
  }
  std::string_view pool;
  if (auto error = object["pool"].get(pool); error == simdjson::SUCCESS && !pool.empty()) {
    finish.pool = std::string(pool);
  } else if (error != simdjson::NO_SUCH_FIELD) {
    return absl::InvalidArgumentError("the finish body's \"pool\" is not a non-empty string");
  }
  simdjson::dom::element scalars;
  if (object["scalars"].get(scalars) == simdjson::SUCCESS) {
    ASSIGN_OR_RETURN(finish.scalars,
                     ParseScalarsJson(simdjson::minify(scalars), "the finish body's \"scalars\""));
  }
  return finish;
}

}  // namespace rollpack
