#include "server/store/names.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace rollpack {
namespace {

// Offset of the first byte that is not part of valid UTF-8 or is a control
// character (C0, DEL, C1), or npos.
size_t FirstBadByte(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7F) return i;
      ++i;
      continue;
    }
    size_t extra = 0;
    uint32_t code = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      extra = 1;
      code = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2;
      code = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3;
      code = c & 0x07;
    } else {
      return i;
    }
    if (s.size() - i <= extra) return i;
    for (size_t k = 1; k <= extra; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      code = (code << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates, past U+10FFFF, and the C1 controls.
    if ((extra == 2 && code < 0x800) || (extra == 3 && code < 0x10000) ||
        (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF || (code >= 0x80 && code <= 0x9F)) {
      return i;
    }
    i += extra + 1;
  }
  return absl::string_view::npos;
}

}  // namespace

absl::Status ValidateName(absl::string_view what, absl::string_view name, size_t max_bytes) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (name.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", name.size(),
                                                   " bytes, at most ", max_bytes));
  }
  if (const size_t bad = FirstBadByte(name); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " holds a control character or invalid UTF-8 at byte ", bad,
        " (names are printable UTF-8)"));
  }
  return absl::OkStatus();
}

}  // namespace rollpack
