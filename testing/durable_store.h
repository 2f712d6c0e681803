// A SampleStore over a durable log in a temporary directory, reopened the
// way rollpackd recovers at start (store tests of durable mode).
#ifndef ROLLPACK_TESTING_DURABLE_STORE_H_
#define ROLLPACK_TESTING_DURABLE_STORE_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/store/durable_log.h"
#include "server/store/log_replay.h"
#include "server/store/sample_store.h"

namespace rollpack {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/rollpack_durable_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A store over the log in `dir`, recovered from it.
struct Durable {
  std::unique_ptr<DurableLog> log;
  std::unique_ptr<SampleStore> store;
  RecoveryInfo info;
};

inline absl::StatusOr<Durable> OpenDurable(const std::string& dir,
                                           int64_t compact_min_dead_bytes = 1 << 30,
                                           int64_t max_memory = int64_t{1} << 32) {
  DurableLogOptions options;
  options.dir = dir;
  options.compact_min_dead_bytes = compact_min_dead_bytes;
  std::vector<LogRecord> records;
  Durable d;
  absl::StatusOr<std::unique_ptr<DurableLog>> log = DurableLog::Open(options, &records, &d.info);
  if (!log.ok()) return log.status();
  d.store = std::make_unique<SampleStore>(max_memory);
  if (absl::Status s = ReplayLog(records, d.store.get()); !s.ok()) return s;
  d.log = *std::move(log);
  d.store->AttachLog(d.log.get());
  return d;
}

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_DURABLE_STORE_H_
