#include "server/cluster/incarnation.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

constexpr size_t kIncarnationDigits = 32;

absl::Status FileError(absl::string_view what, const std::string& path, int err) {
  return absl::UnavailableError(
      absl::StrCat("member incarnation: cannot ", what, " ", path, ": ", std::strerror(err)));
}

absl::Status WriteDurably(const std::string& dir, const std::string& path,
                          const std::string& text) {
  const std::string temporary = path + ".new";
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError("create", temporary, errno);
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!written) return FileError("write", temporary, err);
  if (rename(temporary.c_str(), path.c_str()) != 0) return FileError("rename", temporary, errno);
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return FileError("open", dir, errno);
  const bool synced = fsync(dir_fd) == 0;
  const int dir_err = errno;
  close(dir_fd);
  if (!synced) return FileError("fsync", dir, dir_err);
  return absl::OkStatus();
}

}  // namespace

bool IsIncarnation(absl::string_view text) {
  if (text.size() != kIncarnationDigits) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

std::string NewIncarnation() {
  std::random_device device;
  std::string out;
  for (int i = 0; i < 4; ++i) out += absl::StrFormat("%08x", device());
  return out;
}

absl::StatusOr<std::string> DataDirIncarnation(const std::string& data_dir,
                                               bool log_had_records) {
  const std::string path = absl::StrCat(data_dir, "/incarnation");
  if (log_had_records) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string kept(absl::StripAsciiWhitespace(text.str()));
    // A data dir of a rollpackd older than incarnations has none: its
    // records made before name no incarnation of this member either.
    if (IsIncarnation(kept)) return kept;
  }
  std::string fresh = NewIncarnation();
  RETURN_IF_ERROR(WriteDurably(data_dir, path, fresh + "\n"));
  return fresh;
}

}  // namespace rollpack
