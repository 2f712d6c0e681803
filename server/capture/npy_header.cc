#include "server/capture/npy_header.h"

#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace rollpack {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);

absl::Status Bad(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("not a .npy array: ", why));
}

// Reads the header dict, a Python literal such as
// {'descr': '<i2', 'fortran_order': False, 'shape': (16383, 48, 8), }
class HeaderReader {
 public:
  explicit HeaderReader(absl::string_view text) : text_(text) {}

  absl::Status Read(NpyArray& array) {
    bool has_descr = false, has_order = false, has_shape = false;
    if (!Take('{')) return Bad("the header is not a dict");
    while (!Take('}')) {
      std::string key;
      if (absl::Status s = String(key); !s.ok()) return s;
      if (!Take(':')) return Bad(absl::StrCat("no ':' after '", key, "'"));
      if (key == "descr") {
        if (absl::Status s = String(array.descr); !s.ok()) return s;
        has_descr = true;
      } else if (key == "fortran_order") {
        bool fortran = false;
        if (absl::Status s = Bool(fortran); !s.ok()) return s;
        if (fortran) return Bad("Fortran order (routing rows are C order)");
        has_order = true;
      } else if (key == "shape") {
        if (absl::Status s = Shape(array.shape); !s.ok()) return s;
        has_shape = true;
      } else {
        return Bad(absl::StrCat("unknown header key '", key, "'"));
      }
      Take(',');
    }
    if (!has_descr || !has_order || !has_shape) {
      return Bad("the header lacks 'descr', 'fortran_order' or 'shape'");
    }
    return absl::OkStatus();
  }

 private:
  void Skip() {
    while (!text_.empty() && absl::ascii_isspace(static_cast<unsigned char>(text_.front()))) {
      text_.remove_prefix(1);
    }
  }
  bool Take(char c) {
    Skip();
    if (text_.empty() || text_.front() != c) return false;
    text_.remove_prefix(1);
    return true;
  }
  absl::Status String(std::string& out) {
    Skip();
    if (text_.empty() || (text_.front() != '\'' && text_.front() != '"')) {
      return Bad("a header key or string is not quoted");
    }
    const char quote = text_.front();
    const size_t end = text_.find(quote, 1);
    if (end == absl::string_view::npos) return Bad("an unterminated string in the header");
    out = std::string(text_.substr(1, end - 1));
    text_.remove_prefix(end + 1);
    return absl::OkStatus();
  }
  absl::Status Bool(bool& out) {
    Skip();
    if (absl::ConsumePrefix(&text_, "True")) {
      out = true;
    } else if (absl::ConsumePrefix(&text_, "False")) {
      out = false;
    } else {
      return Bad("'fortran_order' is not True or False");
    }
    return absl::OkStatus();
  }
  absl::Status Shape(std::vector<int64_t>& out) {
    if (!Take('(')) return Bad("'shape' is not a tuple");
    while (!Take(')')) {
      Skip();
      size_t digits = 0;
      while (digits < text_.size() &&
             absl::ascii_isdigit(static_cast<unsigned char>(text_[digits]))) {
        ++digits;
      }
      int64_t dim = 0;
      if (digits == 0 || !absl::SimpleAtoi(text_.substr(0, digits), &dim)) {
        return Bad("a dimension of 'shape' is not a non-negative integer");
      }
      text_.remove_prefix(digits);
      out.push_back(dim);
      if (!Take(',') && (Skip(), text_.empty() || text_.front() != ')')) {
        return Bad("'shape' is not a tuple of integers");
      }
    }
    return absl::OkStatus();
  }

  absl::string_view text_;
};

absl::Status ReadDtype(NpyArray& array) {
  const std::string& d = array.descr;
  if (d.size() != 3 || (d[1] != 'i' && d[1] != 'u') || d[2] < '1' || d[2] > '8' ||
      (d[2] != '1' && d[2] != '2' && d[2] != '4' && d[2] != '8')) {
    return Bad(absl::StrCat("dtype '", d, "' is not an integer type (routing ids are integers)"));
  }
  array.item_bytes = d[2] - '0';
  array.is_signed = d[1] == 'i';
  const bool little = d[0] == '<' || d[0] == '=' || (d[0] == '|' && array.item_bytes == 1);
  if (!little) {
    return Bad(absl::StrCat("dtype '", d, "' is not little endian"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<size_t> NpyHeaderBytes(absl::string_view file_start) {
  if (file_start.size() < 10 || file_start.substr(0, 6) != kMagic) {
    return Bad("no \\x93NUMPY magic");
  }
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(file_start[i]); };
  const int major = byte(6);
  if (major == 1) return 10 + (byte(8) | (size_t{byte(9)} << 8));
  if (major == 2 || major == 3) {
    if (file_start.size() < 12) return Bad("the header is cut short");
    return 12 + (byte(8) | (size_t{byte(9)} << 8) | (size_t{byte(10)} << 16) |
                 (size_t{byte(11)} << 24));
  }
  return Bad(absl::StrCat("version ", major, " (1, 2 or 3 are known)"));
}

absl::StatusOr<NpyArray> ParseNpyHeader(absl::string_view header) {
  absl::StatusOr<size_t> end = NpyHeaderBytes(header);
  if (!end.ok()) return end.status();
  if (header.size() < *end) return Bad("the header is cut short");
  const size_t header_at = header[6] == 1 ? 10 : 12;
  NpyArray array;
  if (absl::Status s = HeaderReader(header.substr(header_at, *end - header_at)).Read(array);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadDtype(array); !s.ok()) return s;
  int64_t elements = 1;
  for (int64_t dim : array.shape) {
    if (dim != 0 && elements > std::numeric_limits<int64_t>::max() / 8 / dim) {
      return Bad(absl::StrCat("shape (", absl::StrJoin(array.shape, ", "), ") is too large"));
    }
    elements *= dim;
  }
  return array;
}

int64_t NpyDataBytes(const NpyArray& array) {
  int64_t bytes = array.item_bytes;
  for (int64_t dim : array.shape) bytes *= dim;
  return bytes;
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view file) {
  absl::StatusOr<size_t> header_bytes = NpyHeaderBytes(file);
  if (!header_bytes.ok()) return header_bytes.status();
  if (file.size() < *header_bytes) return Bad("the header is cut short");
  absl::StatusOr<NpyArray> array = ParseNpyHeader(file.substr(0, *header_bytes));
  if (!array.ok()) return array.status();
  array->data = file.substr(*header_bytes);
  const int64_t want = NpyDataBytes(*array);
  if (static_cast<int64_t>(array->data.size()) != want) {
    return Bad(absl::StrCat("shape (", absl::StrJoin(array->shape, ", "), ") of ",
                            array->descr, " is ", want, " bytes, the file holds ",
                            array->data.size()));
  }
  return array;
}

}  // namespace rollpack
