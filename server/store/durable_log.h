// Durable mode (--data-dir): an append-only, checksummed log of every
// mutation of the store (registered models, committed samples, created and
// released steps). A mutation is written to the log before it is
// acknowledged; on startup the log is replayed through the same SampleStore
// entry points (log_replay.h), so the recovered state is the state that was
// acknowledged. The log frames typed records; it knows nothing of their
// payloads (log_records.h) or of the store.
//
// File: DIR/rollpack.log = 8-byte header "RPLOG002", then records
//   u32 payload_length | u32 crc32c(type, payload) | u8 type | u32 crc32c(header)
// (little endian). The header's own checksum tells a damaged length from a
// write cut short. Only a provably unfinished last write is cut at start (a
// partial header, a last record running past the end or failing its payload
// checksum, zeros past the last record), and the cut bytes are kept in a
// side file; anything else that does not verify is corruption: Open fails
// with DATA_LOSS naming the offset and leaves the file as it is. A version 1
// file ("RPLOG001", no header checksum) is read and rewritten as version 2.
//
// Compaction rewrites the file from a snapshot of the live state (new file,
// fsync, rename over the old one, fsync the directory), so released steps'
// samples leave the disk.
#ifndef ROLLPACK_SERVER_STORE_DURABLE_LOG_H_
#define ROLLPACK_SERVER_STORE_DURABLE_LOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rollpack {

// When an acknowledged mutation reaches stable storage. Every policy
// survives a crash of the process (kill -9): write() has put the record in
// the kernel's page cache before the acknowledgement. They differ on power
// loss or a kernel crash:
//  - kAlways: fdatasync before the acknowledgement (group commit: one fsync
//    covers every record written meanwhile). Nothing acknowledged is lost.
//  - kBatch: a background thread fdatasyncs every batch_interval; up to that
//    long of acknowledged mutations can be lost.
//  - kNever: the kernel writes back when it likes (about 30 s by default).
enum class FsyncPolicy { kAlways, kBatch, kNever };

absl::StatusOr<FsyncPolicy> ParseFsyncPolicy(absl::string_view name);
const char* FsyncPolicyName(FsyncPolicy policy);

struct DurableLogOptions {
  std::string dir;
  FsyncPolicy fsync = FsyncPolicy::kAlways;
  absl::Duration batch_interval = absl::Milliseconds(50);
  // Compact when the bytes of dead records (released steps and their
  // samples) exceed both of these.
  int64_t compact_min_dead_bytes = int64_t{64} << 20;
  double compact_dead_fraction = 0.5;
};

// What a record holds; the payloads are log_records.h's.
enum class RecordType : uint8_t {
  kRegisterModel = 1,  // v1::RegisterModelRequest
  kPutSamples = 2,     // EncodeSamples(pool, samples)
  kCreateStep = 3,     // v1::CreateStepRequest: resolved ids, normalised topology
  kReleaseStep = 4,    // v1::ReleaseStepRequest (a step or a hold)
  kHoldSamples = 5,    // v1::HoldSamplesRequest (cluster mode)
  kDropHold = 6,       // v1::StepHoldRequest (cluster mode)
  // The sample lifecycle (../shared/spec/lifecycle.md):
  kPutGroupedSamples = 7,  // kPutSamples with group sizes (log_records.h)
  kSetPolicyVersion = 8,   // v1::SetPolicyVersionRequest (sets; drops are kDropSamples)
  kDropSamples = 9,        // v1::DroppedSamplesRecord
  kSampleUses = 10,        // v1::SampleUsesRecord (written by compaction)
  // kPutGroupedSamples with piece messages and pieced samples (section 5).
  kPieceSamples = 11,
  // Samples' recompute routing (R2): v1::RecomputeRoutingRecord.
  kRecomputeRouting = 12,
  // Scalars AnnotateSamples added to stored samples (lifecycle.md section
  // 6), applied whole: v1::AnnotationsRecord.
  kAnnotations = 13,
  // A pool deleted with everything it held (Rollouts.DeletePool):
  // v1::DeletePoolRequest. Replay deletes it again, so records before it
  // never bring the pool back.
  kDeletePool = 14,
  // kPieceSamples with ragged per-token fields (layout.md section 13),
  // written only for samples that carry one (log_records.h).
  kRaggedSamples = 15,
};
// Types 5 and 6 appear only in a cluster member's log; a rollpackd older
// than them refuses such a log as corrupt rather than misreading it.
inline constexpr int kMaxRecordType = 15;

// u32 payload length, u32 crc32c(type, payload), u8 type, u32 crc32c of
// these 9 bytes (format version 2).
inline constexpr int kLogRecordHeaderBytes = 13;

struct LogRecord {
  RecordType type;
  std::string payload;
};

struct RecoveryInfo {
  int64_t records = 0;
  int64_t bytes = 0;
  // Bytes cut off the end of the log (0 when the file was clean): only a
  // last write left unfinished, or zeros past the last record. They are
  // kept in `cut_file` (DIR/rollpack.log.cut-OFFSET-NANOS); `cut_reason` says why.
  int64_t torn_tail_bytes = 0;
  std::string cut_file;
  std::string cut_reason;
  // The log was in format version 1 and was rewritten as version 2.
  bool converted_from_v1 = false;
  // A compaction's half-written copy (a kill during compaction) was removed.
  bool removed_compaction_file = false;
};

class DurableLog {
 public:
  // Opens (creating the directory and file) and reads every valid record
  // into `records`, dropping a torn tail. Holds an exclusive lock on the
  // directory for the log's life: FAILED_PRECONDITION naming the other
  // process's pid when another rollpackd holds it. DATA_LOSS for corruption
  // before the tail or a foreign file; INTERNAL for I/O errors.
  static absl::StatusOr<std::unique_ptr<DurableLog>> Open(const DurableLogOptions& options,
                                                          std::vector<LogRecord>* records,
                                                          RecoveryInfo* info);
  ~DurableLog();
  DurableLog(const DurableLog&) = delete;
  DurableLog& operator=(const DurableLog&) = delete;

  // Writes one record (no fsync). Returns a ticket for Sync. On failure the
  // file is cut back to where it was, so nothing of the record remains:
  // RESOURCE_EXHAUSTED for a full disk or file size limit (ENOSPC, EDQUOT,
  // EFBIG), UNAVAILABLE for other I/O errors or a failed log.
  absl::StatusOr<int64_t> Append(RecordType type, absl::string_view payload);
  // Returns once the record of `ticket` (and all before it) is as durable
  // as the policy promises. After a failed fsync the log refuses every
  // further write (UNAVAILABLE): what the kernel did with the dirty pages is
  // unknown, so nothing more may be acknowledged.
  absl::Status Sync(int64_t ticket);

  // Marks `bytes` of earlier records dead (released).
  void AddDeadBytes(int64_t bytes);
  bool ShouldCompact() const;

  // Replaces the log by the records `write` emits, atomically. Callers must
  // keep other writers out (the store holds its lock).
  class Rewriter {
   public:
    virtual ~Rewriter() = default;
    virtual absl::Status Add(RecordType type, absl::string_view payload) = 0;
  };
  absl::Status Rewrite(const std::function<absl::Status(Rewriter*)>& write);

  // The ticket of the last record written.
  int64_t written() const;
  int64_t file_bytes() const;
  int64_t dead_bytes() const;
  int64_t compactions() const;
  // Compactions that failed (the old log stays; the next release retries),
  // and why the last one did.
  int64_t compaction_failures() const;
  absl::Status last_compaction_error() const;
  const DurableLogOptions& options() const { return options_; }
  std::string path() const;

 private:
  explicit DurableLog(DurableLogOptions options) : options_(std::move(options)) {}
  void BatchSyncLoop();
  absl::Status RewriteOnce(const std::function<absl::Status(Rewriter*)>& write);
  absl::Status LockDir();

  const DurableLogOptions options_;
  // Lock order: sync_mu_ before mu_.
  absl::Mutex sync_mu_;
  mutable absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  int lock_fd_ = -1;  // DIR/rollpack.lock, flock'ed while the log is open
  int64_t file_size_ ABSL_GUARDED_BY(mu_) = 0;
  // Logical bytes: monotonic over rewrites, the unit of tickets.
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t durable_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dead_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t compactions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t compaction_failures_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_compaction_error_ ABSL_GUARDED_BY(mu_);
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread batch_thread_;
};

// Bytes a record of `payload_bytes` takes in the file: what compaction
// accounting counts as dead once the record is released.
int64_t LogRecordBytes(size_t payload_bytes);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_DURABLE_LOG_H_
