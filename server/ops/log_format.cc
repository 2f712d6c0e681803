#include "server/ops/log_format.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace rollpack {
namespace {

// %* in a pattern: the message, escaped for a JSON string.
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string escaped =
        JsonEscape(absl::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

// Length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF), or 0.
size_t Utf8Length(absl::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  auto in = [](unsigned char c, unsigned char lo, unsigned char hi) { return c >= lo && c <= hi; };
  const unsigned char c = byte(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (in(c, 0xC2, 0xDF)) {
    n = 2;
  } else if (in(c, 0xE0, 0xEF)) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (in(c, 0xF0, 0xF4)) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size() || !in(byte(1), lo, hi)) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (!in(byte(k), 0x80, 0xBF)) return 0;
  }
  return n;
}

}  // namespace

std::string JsonEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = text[i];
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\u%04x", c);
    } else if (c >= 0x80) {
      const size_t n = Utf8Length(text, i);
      if (n == 0) {
        out += "\\ufffd";
        ++i;
        continue;
      }
      out.append(text.data() + i, n);
      i += n;
      continue;
    } else {
      out.push_back(static_cast<char>(c));
    }
    ++i;
  }
  return out;
}

absl::Status ConfigureLogging(absl::string_view level, absl::string_view format) {
  spdlog::level::level_enum parsed;
  if (level == "trace") {
    parsed = spdlog::level::trace;
  } else if (level == "debug") {
    parsed = spdlog::level::debug;
  } else if (level == "info") {
    parsed = spdlog::level::info;
  } else if (level == "warning" || level == "warn") {
    parsed = spdlog::level::warn;
  } else if (level == "error") {
    parsed = spdlog::level::err;
  } else if (level == "off") {
    parsed = spdlog::level::off;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "log level \"", level, "\" is not one of trace, debug, info, warning, error, off"));
  }
  if (format == "text") {
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  } else if (format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonMessageFlag>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","thread":%t,"msg":"%*"})");
    spdlog::set_formatter(std::move(formatter));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("log format \"", format, "\" is not one of text, json"));
  }
  spdlog::set_level(parsed);
  return absl::OkStatus();
}

}  // namespace rollpack
