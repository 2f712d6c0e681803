#include "server/store/durable_log.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rollpack/v1/rollouts.pb.h"
#include "rollpack/v1/scheduler.pb.h"
#include "server/store/convert.h"
#include "server/store/sample_store.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace rollpack {
namespace {

constexpr char kFileHeader[8] = {'R', 'P', 'L', 'O', 'G', '0', '0', '1'};
constexpr int kRecordHeader = 9;  // u32 length, u32 crc, u8 type
// A record larger than this is not something we wrote: corruption.
constexpr uint32_t kMaxRecordBytes = 1u << 31;

// ---------------------------------------------------------------- CRC-32C

struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};

uint32_t Crc32cSoftware(const unsigned char* p, size_t n, uint32_t crc) {
  static const Crc32cTable table;
  for (size_t i = 0; i < n; ++i) crc = table.t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(const unsigned char* p, size_t n,
                                                          uint32_t crc) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return c32;
}
#endif

uint32_t Crc32cRaw(const unsigned char* p, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return Crc32cHardware(p, n, crc);
#endif
  return Crc32cSoftware(p, n, crc);
}

uint32_t RecordCrc(uint8_t type, absl::string_view payload) {
  uint32_t crc = Crc32cRaw(&type, 1, 0xFFFFFFFFu);
  crc = Crc32cRaw(reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), crc);
  return crc ^ 0xFFFFFFFFu;
}

void PutU32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out->append(b, 4);
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string RecordHeader(RecordType type, absl::string_view payload) {
  std::string header;
  PutU32(&header, static_cast<uint32_t>(payload.size()));
  PutU32(&header, RecordCrc(static_cast<uint8_t>(type), payload));
  header.push_back(static_cast<char>(type));
  return header;
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

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void U32(uint32_t v) { PutU32(out_, v); }
  void U64(uint64_t v) {
    U32(static_cast<uint32_t>(v));
    U32(static_cast<uint32_t>(v >> 32));
  }
  void Bytes(absl::string_view s) {
    U64(s.size());
    out_->append(s.data(), s.size());
  }

 private:
  std::string* out_;
};

class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool U32(uint32_t* v) {
    if (in_.size() < 4) return false;
    *v = GetU32(in_.data());
    in_.remove_prefix(4);
    return true;
  }
  bool U64(uint64_t* v) {
    uint32_t lo, hi;
    if (!U32(&lo) || !U32(&hi)) return false;
    *v = (static_cast<uint64_t>(hi) << 32) | lo;
    return true;
  }
  bool Bytes(std::string* s) {
    uint64_t n;
    if (!U64(&n) || n > in_.size()) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }

 private:
  absl::string_view in_;
};

void EncodeSample(const StoredSample& s, Writer* w) {
  w->Bytes(s.sample_id);
  w->Bytes(s.group_id);
  w->U64(static_cast<uint64_t>(s.policy_version));
  w->Bytes(absl::string_view(reinterpret_cast<const char*>(s.tokens.data()),
                             s.tokens.size() * sizeof(int32_t)));
  w->Bytes(s.experts);
  w->Bytes(absl::string_view(reinterpret_cast<const char*>(s.row_valid.data()), s.row_valid.size()));
  w->U32(static_cast<uint32_t>(s.token_fields.size()));
  for (const auto& [name, field] : s.token_fields) {
    w->Bytes(name);
    w->U32(static_cast<uint32_t>(field.dtype));
    w->U32(static_cast<uint32_t>(field.trailing_shape.size()));
    for (int64_t d : field.trailing_shape) w->U64(static_cast<uint64_t>(d));
    w->Bytes(field.data);
  }
  w->U32(static_cast<uint32_t>(s.scalars.size()));
  for (const auto& [name, value] : s.scalars) {
    w->Bytes(name);
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    w->U64(bits);
  }
}

bool DecodeSample(Reader* r, StoredSample* s) {
  uint64_t u64;
  uint32_t count;
  std::string bytes;
  if (!r->Bytes(&s->sample_id) || !r->Bytes(&s->group_id) || !r->U64(&u64)) return false;
  s->policy_version = static_cast<int64_t>(u64);
  if (!r->Bytes(&bytes) || bytes.size() % sizeof(int32_t) != 0) return false;
  s->tokens.resize(bytes.size() / sizeof(int32_t));
  if (!bytes.empty()) std::memcpy(s->tokens.data(), bytes.data(), bytes.size());
  if (!r->Bytes(&s->experts) || !r->Bytes(&bytes)) return false;
  s->row_valid.assign(bytes.begin(), bytes.end());
  if (!r->U32(&count)) return false;
  for (uint32_t i = 0; i < count; ++i) {
    std::string name;
    StoredField field;
    uint32_t dtype, ndims;
    if (!r->Bytes(&name) || !r->U32(&dtype) || !r->U32(&ndims) || ndims > 16) return false;
    field.dtype = static_cast<v1::DType>(dtype);
    for (uint32_t d = 0; d < ndims; ++d) {
      if (!r->U64(&u64)) return false;
      field.trailing_shape.push_back(static_cast<int64_t>(u64));
    }
    if (!r->Bytes(&field.data)) return false;
    s->token_fields.emplace(std::move(name), std::move(field));
  }
  if (!r->U32(&count)) return false;
  for (uint32_t i = 0; i < count; ++i) {
    std::string name;
    double value;
    if (!r->Bytes(&name) || !r->U64(&u64)) return false;
    std::memcpy(&value, &u64, sizeof(value));
    s->scalars.emplace(std::move(name), value);
  }
  return true;
}

// Writes records of a rewrite into the new file.
class FileRewriter final : public DurableLog::Rewriter {
 public:
  FileRewriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  absl::Status Add(RecordType type, absl::string_view payload) override {
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

uint32_t Crc32c(absl::string_view data, uint32_t crc) {
  return Crc32cRaw(reinterpret_cast<const unsigned char*>(data.data()), data.size(),
                   crc ^ 0xFFFFFFFFu) ^
         0xFFFFFFFFu;
}

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
  const std::string path = log->path();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("cannot open", path, errno);
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
  *info = RecoveryInfo{};
  int64_t good_end = sizeof(kFileHeader);
  if (data.size() < sizeof(kFileHeader)) {
    // New file, or a crash while writing the header: start over.
    info->torn_tail_bytes = static_cast<int64_t>(data.size());
    if (ftruncate(fd, 0) != 0 ||
        WriteAllAt(fd, 0, {absl::string_view(kFileHeader, sizeof(kFileHeader))}) != 0 ||
        fdatasync(fd) != 0) {
      return IoError("cannot initialise", path, errno);
    }
    if (FsyncDir(options.dir) != 0) return IoError("cannot fsync directory", options.dir, errno);
  } else {
    if (std::memcmp(data.data(), kFileHeader, sizeof(kFileHeader)) != 0) {
      return absl::DataLossError(absl::StrCat("durable log: ", path, " is not a rollpack log"));
    }
    size_t pos = sizeof(kFileHeader);
    while (pos < data.size()) {
      const size_t left = data.size() - pos;
      bool torn = false;
      if (left < kRecordHeader) {
        torn = true;
      } else {
        const uint32_t length = GetU32(data.data() + pos);
        const uint32_t crc = GetU32(data.data() + pos + 4);
        const uint8_t type = static_cast<uint8_t>(data[pos + 8]);
        if (length >= kMaxRecordBytes || kRecordHeader + static_cast<size_t>(length) > left) {
          // Runs past the end of the file: a write cut short.
          torn = true;
        } else {
          absl::string_view payload(data.data() + pos + kRecordHeader, length);
          const bool type_ok = type >= 1 && type <= 4;
          if (!type_ok || RecordCrc(type, payload) != crc) {
            if (pos + kRecordHeader + length == data.size()) {
              torn = true;  // the last record: a torn write
            } else {
              return absl::DataLossError(absl::StrCat(
                  "durable log: ", path, ": record at offset ", pos, " fails its checksum and ",
                  data.size() - pos - kRecordHeader - length,
                  " bytes follow it; refusing to start (move the file away to start empty)"));
            }
          } else {
            records->push_back({static_cast<RecordType>(type), std::string(payload)});
            pos += kRecordHeader + length;
            info->records++;
            continue;
          }
        }
      }
      if (torn) {
        info->torn_tail_bytes = static_cast<int64_t>(left);
        if (ftruncate(fd, static_cast<off_t>(pos)) != 0 || fdatasync(fd) != 0) {
          return IoError("cannot drop the torn tail of", path, errno);
        }
        break;
      }
    }
    good_end = static_cast<int64_t>(pos);
  }
  info->bytes = good_end;
  log->file_size_ = good_end;
  log->written_ = good_end;
  log->durable_ = good_end;
  if (options.fsync == FsyncPolicy::kBatch) {
    log->batch_thread_ = std::thread([raw = log.get()] { raw->BatchSyncLoop(); });
  }
  return log;
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

std::string EncodeSamples(absl::string_view pool, absl::Span<const StoredSample* const> samples) {
  std::string out;
  int64_t size = 16 + static_cast<int64_t>(pool.size());
  for (const StoredSample* s : samples) size += EncodedSampleBytes(*s);
  out.reserve(static_cast<size_t>(size));
  Writer w(&out);
  w.Bytes(pool);
  w.U32(static_cast<uint32_t>(samples.size()));
  for (const StoredSample* s : samples) EncodeSample(*s, &w);
  return out;
}

std::string EncodeSamples(absl::string_view pool, absl::Span<const StoredSample> samples) {
  std::vector<const StoredSample*> ptrs;
  ptrs.reserve(samples.size());
  for (const StoredSample& s : samples) ptrs.push_back(&s);
  return EncodeSamples(pool, absl::MakeConstSpan(ptrs));
}

int64_t EncodedSampleBytes(const StoredSample& s) {
  int64_t n = 8 * 6 + 8 + static_cast<int64_t>(s.sample_id.size() + s.group_id.size() +
                                               s.tokens.size() * 4 + s.experts.size() +
                                               s.row_valid.size());
  for (const auto& [name, field] : s.token_fields) {
    n += 8 + name.size() + 8 + 8 * field.trailing_shape.size() + 8 + field.data.size();
  }
  for (const auto& [name, value] : s.scalars) n += 16 + name.size();
  return n;
}

absl::Status DecodeSamples(absl::string_view payload, std::string* pool,
                           std::vector<StoredSample>* samples) {
  Reader r(payload);
  uint32_t count;
  if (!r.Bytes(pool) || !r.U32(&count)) return absl::DataLossError("truncated samples record");
  for (uint32_t i = 0; i < count; ++i) {
    StoredSample s;
    if (!DecodeSample(&r, &s)) {
      return absl::DataLossError(absl::StrCat("samples record: sample ", i, " does not decode"));
    }
    samples->push_back(std::move(s));
  }
  if (!r.done()) return absl::DataLossError("samples record: trailing bytes");
  return absl::OkStatus();
}

std::string EncodeRegisterModel(const std::string& pool, const ModelSpec& model) {
  v1::RegisterModelRequest request;
  request.set_pool(pool);
  *request.mutable_model() = ToProto(model);
  return request.SerializeAsString();
}

std::string EncodeCreateStep(const Step& step) {
  v1::CreateStepRequest request;
  request.set_step_id(step.step_id);
  request.set_pool(step.pool);
  for (const auto& sample : step.samples) request.add_sample_ids(sample->sample_id);
  *request.mutable_topology() = ToProto(step.topology);
  return request.SerializeAsString();
}

std::string EncodeReleaseStep(const std::string& step_id) {
  v1::ReleaseStepRequest request;
  request.set_step_id(step_id);
  return request.SerializeAsString();
}

absl::Status ReplayLog(absl::Span<const LogRecord> records, SampleStore* store) {
  for (size_t i = 0; i < records.size(); ++i) {
    const LogRecord& record = records[i];
    absl::Status s;
    switch (record.type) {
      case RecordType::kRegisterModel: {
        v1::RegisterModelRequest request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("RegisterModel record does not parse");
          break;
        }
        s = store->RegisterModel(request.pool(), FromProto(request.model())).status();
        break;
      }
      case RecordType::kPutSamples: {
        std::string pool;
        std::vector<StoredSample> samples;
        s = DecodeSamples(record.payload, &pool, &samples);
        if (s.ok()) s = store->Put(pool, std::move(samples)).status();
        break;
      }
      case RecordType::kCreateStep: {
        v1::CreateStepRequest request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("CreateStep record does not parse");
          break;
        }
        absl::StatusOr<Topology> topology = NormalizeTopology(request.topology());
        if (!topology.ok()) {
          s = topology.status();
          break;
        }
        const std::vector<std::string> ids(request.sample_ids().begin(), request.sample_ids().end());
        s = store->CreateStep(request.step_id(), request.pool(), ids, 0, *topology).status();
        break;
      }
      case RecordType::kReleaseStep: {
        v1::ReleaseStepRequest request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("ReleaseStep record does not parse");
          break;
        }
        s = store->ReleaseStep(request.step_id()).status();
        break;
      }
      default:
        s = absl::DataLossError("unknown record type");
    }
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat("durable log: replaying record ", i, " (type ",
                                              static_cast<int>(record.type),
                                              ") failed: ", s.ToString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace rollpack
