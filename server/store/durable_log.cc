#include "server/store/durable_log.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/store/crc32c.h"
#include "server/store/little_endian.h"

namespace rollpack {
namespace {

// Version 2 checksums each record's header apart from its payload, so a
// damaged length is told from a write cut short. Version 1 files are read
// (with version 1's rules) and rewritten as version 2 when opened.
constexpr char kFileHeader[8] = {'R', 'P', 'L', 'O', 'G', '0', '0', '2'};
constexpr char kFileHeaderV1[8] = {'R', 'P', 'L', 'O', 'G', '0', '0', '1'};
constexpr int kRecordHeader = kLogRecordHeaderBytes;
constexpr int kRecordHeaderV1 = 9;  // no header checksum
// A record larger than this is not something we wrote: corruption.
constexpr uint32_t kMaxRecordBytes = 1u << 31;

uint32_t RecordCrc(uint8_t type, absl::string_view payload) {
  return Crc32c(payload, Crc32c(absl::string_view(reinterpret_cast<const char*>(&type), 1)));
}

std::string RecordHeader(RecordType type, absl::string_view payload) {
  std::string header;
  PutU32(&header, static_cast<uint32_t>(payload.size()));
  PutU32(&header, RecordCrc(static_cast<uint8_t>(type), payload));
  header.push_back(static_cast<char>(type));
  PutU32(&header, Crc32c(header));
  return header;
}

bool AllZero(absl::string_view bytes) {
  return bytes.find_first_not_of('\0') == absl::string_view::npos;
}

// Reads the records of `data` (a whole log file) into `records`; returns
// where the good records end. What follows them, if anything, is a tail to
// cut (its reason in *why): only a write that was provably the last and
// unfinished, or zeros a crash left past the end. DATA_LOSS for anything
// else: damage with records after it, or a header that fails its checksum.
absl::StatusOr<size_t> ScanRecords(absl::string_view data, bool v1, const std::string& path,
                                   std::vector<LogRecord>* records, std::string* why) {
  const size_t header_bytes = v1 ? kRecordHeaderV1 : kRecordHeader;
  size_t pos = sizeof(kFileHeader);
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(
        "durable log: ", path, ": record at offset ", pos, " ", what, " and ", data.size() - pos,
        " bytes from there on cannot be read; refusing to start (the file is unchanged: move it "
        "away to start empty, or keep it for inspection)"));
  };
  while (pos < data.size()) {
    const absl::string_view rest = data.substr(pos);
    if (!v1 && rest.size() >= kRecordHeader && !AllZero(rest)) {
      if (Crc32c(rest.substr(0, 9)) != GetU32(rest.data() + 9)) {
        return corrupt("has a header that fails its checksum");
      }
    }
    if (rest.size() < header_bytes) {
      *why = "a partial record header at the end of the file (a write cut short)";
      return pos;
    }
    if (!v1 && AllZero(rest)) {
      *why = "zeros past the last record (a crash after the file grew)";
      return pos;
    }
    const uint32_t length = GetU32(rest.data());
    const uint32_t crc = GetU32(rest.data() + 4);
    const uint8_t type = static_cast<uint8_t>(rest[8]);
    if (length >= kMaxRecordBytes) {
      if (!v1) return corrupt(absl::StrCat("declares ", length, " bytes"));
      *why = "a version 1 record that runs past the end of the file";
      return pos;
    }
    if (header_bytes + static_cast<size_t>(length) > rest.size()) {
      // Version 2: the header is intact, so the length is what was written.
      *why = "a last record that runs past the end of the file (a write cut short)";
      return pos;
    }
    const absl::string_view payload = rest.substr(header_bytes, length);
    const bool last = header_bytes + length == rest.size();
    if (type < 1 || type > kMaxRecordType) {
      if (!v1) return corrupt(absl::StrCat("has unknown type ", type));
      if (!last) return corrupt("fails its checksum");
      *why = "a last version 1 record of unknown type";
      return pos;
    }
    if (RecordCrc(type, payload) != crc) {
      if (!last) return corrupt("fails its checksum");
      *why = "a last record whose payload fails its checksum (a write cut short)";
      return pos;
    }
    records->push_back({static_cast<RecordType>(type), std::string(payload)});
    pos += header_bytes + length;
  }
  return pos;
}

absl::Status IoError(absl::string_view what, const std::string& path, int err) {
  const std::string message = absl::StrCat("durable log: ", what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    return absl::ResourceExhaustedError(absl::StrCat(message, " (disk full; nothing of this request was stored)"));
  }
  return absl::UnavailableError(message);
}

// Writes all of `parts` at `offset`; on error returns errno.
int WriteAllAt(int fd, int64_t offset, std::initializer_list<absl::string_view> parts) {
  for (absl::string_view part : parts) {
    const char* p = part.data();
    size_t left = part.size();
    while (left > 0) {
      const ssize_t n = pwrite(fd, p, left, offset);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      if (n == 0) return ENOSPC;
      p += n;
      left -= static_cast<size_t>(n);
      offset += n;
    }
  }
  return 0;
}

int FsyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int rc = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

// ------------------------------------------------------- sample encoding

// Writes records of a rewrite into the new file.
class FileRewriter final : public DurableLog::Rewriter {
 public:
  FileRewriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  absl::Status Add(RecordType type, absl::string_view payload) override {
    if (payload.size() >= kMaxRecordBytes) {
      // Append refuses such a record too: the reader would take it for corruption.
      return absl::InternalError(absl::StrCat("compaction: a record of ", payload.size(),
                                              " bytes is over the log's limit"));
    }
    const std::string header = RecordHeader(type, payload);
    if (int err = WriteAllAt(fd_, size_, {header, payload}); err != 0) {
      return IoError("compaction write to", path_, err);
    }
    size_ += static_cast<int64_t>(header.size() + payload.size());
    return absl::OkStatus();
  }
  int64_t size() const { return size_; }

 private:
  const int fd_;
  const std::string path_;
  int64_t size_ = sizeof(kFileHeader);
};

}  // namespace

absl::StatusOr<FsyncPolicy> ParseFsyncPolicy(absl::string_view name) {
  if (name == "always") return FsyncPolicy::kAlways;
  if (name == "batch") return FsyncPolicy::kBatch;
  if (name == "never") return FsyncPolicy::kNever;
  return absl::InvalidArgumentError(
      absl::StrCat("--fsync is \"", name, "\"; expected always, batch or never"));
}

const char* FsyncPolicyName(FsyncPolicy policy) {
  switch (policy) {
    case FsyncPolicy::kAlways: return "always";
    case FsyncPolicy::kBatch: return "batch";
    case FsyncPolicy::kNever: return "never";
  }
  return "?";
}

std::string DurableLog::path() const { return options_.dir + "/rollpack.log"; }

absl::StatusOr<std::unique_ptr<DurableLog>> DurableLog::Open(const DurableLogOptions& options,
                                                             std::vector<LogRecord>* records,
                                                             RecoveryInfo* info) {
  if (options.dir.empty()) return absl::InvalidArgumentError("durable log: empty --data-dir");
  if (mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return IoError("cannot create directory", options.dir, errno);
  }
  std::unique_ptr<DurableLog> log(new DurableLog(options));
  *info = RecoveryInfo{};
  RETURN_IF_ERROR(log->LockDir());
  const std::string path = log->path();
  // A compaction killed before its rename: the log it was replacing is
  // still the log, and the half-written copy is of no use.
  const std::string leftover = path + ".compact";
  if (unlink(leftover.c_str()) == 0) {
    info->removed_compaction_file = true;
  } else if (errno != ENOENT) {
    return IoError("cannot remove", leftover, errno);
  }
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("cannot open", path, errno);
  bool convert_v1 = false;
  std::vector<LogRecord>* const read = records;
  {
    absl::MutexLock lock(&log->mu_);
    log->fd_ = fd;

    // Read the whole file (it holds at most the live data plus dead bytes
    // below the compaction threshold).
    std::string data;
    {
      struct stat st;
      if (fstat(fd, &st) != 0) return IoError("cannot stat", path, errno);
      data.resize(static_cast<size_t>(st.st_size));
      size_t got = 0;
      while (got < data.size()) {
        const ssize_t n = pread(fd, data.data() + got, data.size() - got, static_cast<off_t>(got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return IoError("cannot read", path, n < 0 ? errno : EIO);
        got += static_cast<size_t>(n);
      }
    }
    int64_t good_end = sizeof(kFileHeader);
    if (data.size() < sizeof(kFileHeader)) {
      // New file, or a crash while writing the header: start over. Anything
      // else this short is not ours to overwrite.
      const absl::string_view head(data);
      if (absl::string_view(kFileHeader, sizeof(kFileHeader)).substr(0, head.size()) != head &&
          absl::string_view(kFileHeaderV1, sizeof(kFileHeaderV1)).substr(0, head.size()) != head) {
        return absl::DataLossError(absl::StrCat("durable log: ", path, " is not a rollpack log"));
      }
      info->torn_tail_bytes = static_cast<int64_t>(data.size());
      if (!data.empty()) info->cut_reason = "a file header cut short (a crash while creating it)";
      if (ftruncate(fd, 0) != 0 ||
          WriteAllAt(fd, 0, {absl::string_view(kFileHeader, sizeof(kFileHeader))}) != 0 ||
          fdatasync(fd) != 0) {
        return IoError("cannot initialise", path, errno);
      }
      if (FsyncDir(options.dir) != 0) return IoError("cannot fsync directory", options.dir, errno);
    } else {
      convert_v1 = std::memcmp(data.data(), kFileHeaderV1, sizeof(kFileHeaderV1)) == 0;
      if (!convert_v1 && std::memcmp(data.data(), kFileHeader, sizeof(kFileHeader)) != 0) {
        return absl::DataLossError(absl::StrCat("durable log: ", path, " is not a rollpack log"));
      }
      std::string why;
      ASSIGN_OR_RETURN(const size_t end, ScanRecords(data, convert_v1, path, records, &why));
      info->records = static_cast<int64_t>(records->size());
      if (end < data.size()) {
        // Nothing is thrown away: the cut bytes go to a side file first.
        // Named by offset and time: a later cut at the same offset (a crash
        // loop) must not replace this one.
        const std::string side =
            absl::StrCat(path, ".cut-", end, "-", absl::GetCurrentTimeNanos());
        const int side_fd = open(side.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (side_fd < 0) return IoError("cannot create", side, errno);
        const int err = WriteAllAt(side_fd, 0, {absl::string_view(data).substr(end)});
        const int synced = err == 0 ? fdatasync(side_fd) : 0;
        close(side_fd);
        if (err != 0 || synced != 0) return IoError("cannot write", side, err != 0 ? err : errno);
        if (FsyncDir(options.dir) != 0) return IoError("cannot fsync directory", options.dir, errno);
        if (ftruncate(fd, static_cast<off_t>(end)) != 0 || fdatasync(fd) != 0) {
          return IoError("cannot cut the tail of", path, errno);
        }
        info->torn_tail_bytes = static_cast<int64_t>(data.size() - end);
        info->cut_file = side;
        info->cut_reason = why;
      }
      good_end = static_cast<int64_t>(end);
    }
    info->bytes = good_end;
    log->file_size_ = good_end;
    log->written_ = good_end;
    log->durable_ = good_end;
    if (options.fsync == FsyncPolicy::kBatch) {
      log->batch_thread_ = std::thread([raw = log.get()] { raw->BatchSyncLoop(); });
    }
  }
  if (convert_v1) {
    // Rewritten at once in version 2, the same way compaction does.
    RETURN_IF_ERROR(log->Rewrite([read](Rewriter* out) -> absl::Status {
      for (const LogRecord& record : *read) RETURN_IF_ERROR(out->Add(record.type, record.payload));
      return absl::OkStatus();
    }));
    info->converted_from_v1 = true;
  }
  return log;
}

absl::Status DurableLog::LockDir() {
  // A lock file of its own: compaction renames the log over itself, which
  // would drop a lock held on the log's inode. The kernel releases the lock
  // when the process dies, so a kill -9 leaves nothing to clean up.
  const std::string path = options_.dir + "/rollpack.lock";
  lock_fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) return IoError("cannot open", path, errno);
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return IoError("cannot lock", path, err);
    char pid[32] = {};
    const ssize_t n = pread(lock_fd_, pid, sizeof(pid) - 1, 0);
    return absl::FailedPreconditionError(absl::StrCat(
        "--data-dir ", options_.dir, " is in use by another rollpackd (pid ",
        n > 0 ? absl::StripAsciiWhitespace(absl::string_view(pid, n)) : "unknown",
        "): two processes appending to one log lose acknowledged data"));
  }
  const std::string self = absl::StrCat(getpid(), "\n");
  if (ftruncate(lock_fd_, 0) != 0 || pwrite(lock_fd_, self.data(), self.size(), 0) < 0) {
    return IoError("cannot write", path, errno);
  }
  return absl::OkStatus();
}

DurableLog::~DurableLog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (batch_thread_.joinable()) batch_thread_.join();
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) {
    fdatasync(fd_);
    close(fd_);
  }
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the directory's lock
}

void DurableLog::BatchSyncLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.batch_interval);
      if (stop_) return;
    }
    absl::MutexLock sync_lock(&sync_mu_);
    int fd;
    int64_t target;
    {
      absl::MutexLock lock(&mu_);
      if (durable_ >= written_ || !failed_.ok()) continue;
      fd = fd_;
      target = written_;
    }
    const int rc = fdatasync(fd) == 0 ? 0 : errno;
    absl::MutexLock lock(&mu_);
    if (rc != 0) {
      failed_ = IoError("fdatasync of", path(), rc);
    } else if (target > durable_) {
      durable_ = target;
    }
  }
}

absl::StatusOr<int64_t> DurableLog::Append(RecordType type, absl::string_view payload) {
  if (payload.size() >= kMaxRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "durable log: a record of ", payload.size(), " bytes is over the 2 GiB record limit"));
  }
  const std::string header = RecordHeader(type, payload);
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  if (int err = WriteAllAt(fd_, file_size_, {header, payload}); err != 0) {
    // Cut the partial record off so a later record does not follow garbage.
    if (ftruncate(fd_, static_cast<off_t>(file_size_)) != 0) {
      failed_ = IoError("cannot cut a failed write off", path(), errno);
    }
    return IoError("write to", path(), err);
  }
  const int64_t bytes = static_cast<int64_t>(header.size() + payload.size());
  file_size_ += bytes;
  written_ += bytes;
  return written_;
}

absl::Status DurableLog::Sync(int64_t ticket) {
  if (options_.fsync != FsyncPolicy::kAlways) {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  absl::MutexLock sync_lock(&sync_mu_);
  int fd;
  int64_t target;
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
    if (durable_ >= ticket) return absl::OkStatus();  // another caller's fsync covered it
    fd = fd_;
    target = written_;
  }
  const int rc = fdatasync(fd) == 0 ? 0 : errno;
  absl::MutexLock lock(&mu_);
  if (rc != 0) {
    failed_ = IoError("fdatasync of", path(), rc);
    return failed_;
  }
  if (target > durable_) durable_ = target;
  return absl::OkStatus();
}

void DurableLog::AddDeadBytes(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  dead_bytes_ += bytes;
}

bool DurableLog::ShouldCompact() const {
  absl::MutexLock lock(&mu_);
  return failed_.ok() && dead_bytes_ > options_.compact_min_dead_bytes &&
         static_cast<double>(dead_bytes_) >
             options_.compact_dead_fraction * static_cast<double>(file_size_);
}

absl::Status DurableLog::Rewrite(const std::function<absl::Status(Rewriter*)>& write) {
  absl::Status s = RewriteOnce(write);
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    compaction_failures_++;
    last_compaction_error_ = s;
  }
  return s;
}

int64_t DurableLog::compaction_failures() const {
  absl::MutexLock lock(&mu_);
  return compaction_failures_;
}

absl::Status DurableLog::last_compaction_error() const {
  absl::MutexLock lock(&mu_);
  return last_compaction_error_;
}

absl::Status DurableLog::RewriteOnce(const std::function<absl::Status(Rewriter*)>& write) {
  absl::MutexLock sync_lock(&sync_mu_);
  const std::string tmp = path() + ".compact";
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("cannot create", tmp, errno);
  auto fail = [&](absl::Status s) {
    close(fd);
    unlink(tmp.c_str());
    return s;
  };
  if (int err = WriteAllAt(fd, 0, {absl::string_view(kFileHeader, sizeof(kFileHeader))}); err != 0) {
    return fail(IoError("compaction write to", tmp, err));
  }
  FileRewriter rewriter(fd, tmp);
  if (absl::Status s = write(&rewriter); !s.ok()) return fail(s);
  if (fdatasync(fd) != 0) return fail(IoError("fdatasync of", tmp, errno));
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return fail(failed_);
  if (rename(tmp.c_str(), path().c_str()) != 0) return fail(IoError("cannot rename", tmp, errno));
  // The old file is gone from the directory; durability of the rename
  // needs the directory fsynced.
  const int dir_rc = FsyncDir(options_.dir);
  close(fd_);
  fd_ = fd;
  file_size_ = rewriter.size();
  durable_ = written_;  // everything live is in the new, synced file
  dead_bytes_ = 0;
  compactions_++;
  if (dir_rc != 0) return IoError("cannot fsync directory", options_.dir, dir_rc);
  return absl::OkStatus();
}

int64_t DurableLog::written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}

int64_t DurableLog::file_bytes() const {
  absl::MutexLock lock(&mu_);
  return file_size_;
}

int64_t DurableLog::dead_bytes() const {
  absl::MutexLock lock(&mu_);
  return dead_bytes_;
}

int64_t DurableLog::compactions() const {
  absl::MutexLock lock(&mu_);
  return compactions_;
}

int64_t LogRecordBytes(size_t payload_bytes) {
  return kLogRecordHeaderBytes + static_cast<int64_t>(payload_bytes);
}

}  // namespace rollpack
