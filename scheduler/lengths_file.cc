#include "scheduler/lengths_file.h"

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace rollpack {

absl::StatusOr<std::vector<int64_t>> ReadLengthsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<int64_t> lengths;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    absl::string_view v = absl::StripAsciiWhitespace(line);
    if (v.empty() || v[0] == '#') continue;
    int64_t n = 0;
    if (!absl::SimpleAtoi(v, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": not an integer: '", v, "'"));
    }
    lengths.push_back(n);
  }
  return lengths;
}

}  // namespace rollpack
