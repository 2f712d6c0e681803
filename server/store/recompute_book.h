// A pool's committed recompute routing (R2, docs/layout.md section 11), by
// sample: the ids a RECOMPUTE step replays for it, with the memory and the
// log bytes they take.
//
// Not thread-safe: SampleStore keeps one in each pool and calls it only
// under its mutex. The book counts; the store charges the bytes to its
// limits and the dead log bytes to its log.
#ifndef ROLLPACK_SERVER_STORE_RECOMPUTE_BOOK_H_
#define ROLLPACK_SERVER_STORE_RECOMPUTE_BOOK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace rollpack {

class RecomputeBook {
 public:
  // What a Store or Erase changed: the memory the routing holds (signed),
  // and the log bytes it made dead (the record of a routing replaced or
  // erased).
  struct Change {
    int64_t bytes = 0;
    int64_t dead_log_bytes = 0;
  };

  bool empty() const { return routing_.empty(); }
  size_t size() const { return routing_.size(); }
  // The sample's routing ([n, stored layers, K] ids), or null. Shared: a
  // step or hold that took it keeps it when a later commit replaces it.
  std::shared_ptr<const std::string> Find(const std::string& sample_id) const;
  // Bytes the sample's routing holds now (0: none).
  int64_t BytesOf(const std::string& sample_id) const;
  // Makes `routing` the sample's, replacing any it had.
  Change Store(const std::string& sample_id, std::string routing);
  // Forgets the sample's routing (a no-op without one).
  Change Erase(const std::string& sample_id);
  // Log bytes the records of every routing here hold.
  int64_t LoggedBytes() const;

  // The book as compaction's records, by sample id (the same state
  // compacts to the same bytes).
  std::vector<std::string> EncodeRecords(const std::string& pool) const;
  // `ids[i]`'s routing as kRecomputeRouting records of bounded size (one
  // sample larger than the bound gets a record of its own). With `step_id`
  // set (a commit), several records are the numbered parts of one commit.
  static std::vector<std::string> EncodeCommit(const std::string& pool,
                                               const std::string& step_id,
                                               absl::Span<const std::string> ids,
                                               absl::Span<const std::string* const> routing);

 private:
  struct Entry {
    std::shared_ptr<const std::string> ids;
    // Its share of the log record that holds it.
    int64_t logged_bytes = 0;
  };
  absl::flat_hash_map<std::string, Entry> routing_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_RECOMPUTE_BOOK_H_
