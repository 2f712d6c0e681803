// One pool of the store (SampleStore): its model and options, its samples
// (sealed ones by id and the free ones by arrival; open ones in its
// OpenSamples), their groups, uses, annotation state and recompute
// routing, the fields every sample of it carries, and the bytes it holds;
// with the rules that need the pool alone: its schema, its groups, how
// selection sees its samples, its statistics.
//
// Not thread-safe: SampleStore keeps its pools under its mutex and calls
// them only under it. What is store-wide stays with the store (the arrival
// clock, the memory limits and byte total, the log, steps, holds and
// annotation tickets): a method that needs some of it takes it as a
// parameter, and what the store must count (bytes added or freed, log
// bytes made dead) it returns.
#ifndef ROLLPACK_SERVER_STORE_POOL_H_
#define ROLLPACK_SERVER_STORE_POOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "scheduler/model_spec.h"
#include "scheduler/sample_selection.h"
#include "server/store/field_schema.h"
#include "server/store/open_samples.h"
#include "server/store/pool_options.h"
#include "server/store/recompute_book.h"
#include "server/store/stored_sample.h"

namespace rollpack {

// A group's samples stored here (lifecycle.md section 2).
struct GroupShareStats {
  std::string group_id;
  int32_t group_size = 0;
  // Sealed samples that count towards completeness: with the pool's
  // required_scalars, only those that have every one (lifecycle.md 6).
  int32_t num_sealed = 0;
  int64_t first_sealed_unix_nanos = 0;
};

struct PoolStats {
  std::string pool;
  ModelSpec model;
  PoolOptions options;
  int64_t num_samples = 0;
  int64_t num_free_samples = 0;
  int64_t num_live_steps = 0;
  int64_t stored_bytes = 0;
  std::map<std::string, FieldSchema> token_fields;
  int64_t num_complete_groups = 0;
  int64_t num_incomplete_groups = 0;
  int64_t num_open_samples = 0;
  int64_t policy_version = 0;
  int64_t num_stale_dropped = 0;
  int64_t num_incomplete_groups_dropped = 0;
  // Free samples stale at policy_version under the pool's max_staleness.
  int64_t num_stale_samples = 0;
  // Sealed free samples still missing one of options.required_scalars
  // (counted in num_free_samples too, but not selectable).
  int64_t num_unannotated_samples = 0;
  // The incomplete groups, by id (a cluster sums them over its members).
  std::vector<GroupShareStats> incomplete_groups;
  // Ragged token fields' names, sorted (layout.md section 13).
  std::vector<std::string> ragged_fields;
};

class Pool {
 public:
  // A group's samples stored here.
  struct Group {
    int32_t size = 0;
    // Sealed samples stored here.
    int32_t stored = 0;
    // Open samples (lifecycle.md section 5): they will be members, so they
    // count against the group's size, but not towards completeness.
    int32_t open = 0;
    int64_t first_sealed_unix_nanos = 0;
    // Dropped for staying incomplete while some samples were in live steps.
    bool expired = false;
    // Sealed samples stored here still missing a required scalar: not
    // counted towards completeness (lifecycle.md section 6).
    int32_t unready = 0;
  };
  // For a sample sealed without a required scalar: when it got the last
  // (a sequence number of the store's arrival clock, and ns since the Unix
  // epoch).
  struct Ready {
    uint64_t seq = 0;
    int64_t unix_nanos = 0;
  };
  // Free samples by arrival sequence number: the oldest first. The map
  // holds the sample itself, so that CreateStep takes what it selects
  // through the map's iterators, with no lookup by id per sample: each
  // lookup is a cache miss in tables of 10^6 entries, and three of them
  // per sample made a step of 10^6 one-token samples grow faster than
  // n log n (issue 18, docs/performance.md).
  using FreeSamples = std::map<uint64_t, std::shared_ptr<const StoredSample>>;

  // Bytes holding `sample` costs in memory, the unit of the store's limits
  // (SampleStore::MemoryBytes, pool_memory.cc): the sample and its entries
  // in a pool's indexes.
  static int64_t MemoryBytes(const StoredSample& sample);

  // Token fields the options declare are the pool's fields from the start:
  // its first sample proposes nothing (nor, in a cluster, races to fix
  // them).
  Pool(ModelSpec model, PoolOptions options);

  // Schema: the token fields (names, dtypes, trailing shapes) and ragged
  // field names (layout.md section 13) every sample carries, fixed by the
  // first accepted sample, by the registration's declared token fields, or
  // in a cluster by the first member's (SampleStore::FixSchemaClusterWide).
  //
  // The fields a batch's first sample (not a later piece) proposes.
  static BatchSchema ProposeSchema(const std::vector<StoredSample>& samples);
  // Both the token fields and the ragged names are fixed.
  bool schema_complete() const { return schema_fixed && ragged_schema.has_value(); }
  // INVALID_ARGUMENT naming a field of `sample` not the pool's (or, where it
  // has none fixed, `batch`'s), or one of those `sample` lacks.
  absl::Status CheckSchema(const StoredSample& sample, const BatchSchema& batch) const;
  // Makes `batch` the pool's fields where none are fixed yet.
  void FixSchema(BatchSchema batch);

  // Groups (lifecycle.md section 2).
  //
  // Refuses a new sample its group cannot take (size mismatch, full group,
  // a group dropped as incomplete); `batch_counts` counts the batch's new
  // samples per group so far.
  absl::Status CheckGroup(const StoredSample& sample,
                          const absl::flat_hash_map<std::string, int32_t>& batch_counts) const;
  // Groups incomplete past the options' incomplete_group_timeout_ms at
  // `now_nanos` (their clock starts at their first sealed sample), sorted.
  std::vector<std::string> ExpiredGroups(int64_t now_nanos) const;
  // Of `group_ids`, those known here, not expired and still incomplete.
  std::vector<std::string> StillIncomplete(const std::vector<std::string>& group_ids) const;
  // Of `group_ids`, the groups complete here, by id, each once.
  std::vector<GroupShareStats> CompleteGroups(const std::vector<std::string>& group_ids) const;
  // Forgets the groups, or marks those with samples in live steps expired.
  void ExpireGroups(absl::Span<const std::string> groups);

  // Samples.
  //
  // Takes the sealed `sample` in as free, arrived at `arrival` (the
  // store's clock) and `now_nanos`, joining its group. Its bytes are the
  // caller's to count.
  void AddSealed(StoredSample&& sample, uint64_t arrival, int64_t now_nanos);
  // Stores a piece as pool.open planned it, with its group's count of open
  // samples; one that seals moves its sample to the free ones, arriving at
  // *next_arrival (then advanced). The bytes it added (counted here too).
  int64_t ApplyPiece(const OpenSamples::Plan& plan, StoredSample piece, int64_t now_nanos,
                     uint64_t* next_arrival);
  // Deletes the stored sealed sample `id` with everything kept about it
  // (its annotation state, recompute routing, group share, uses, arrival).
  struct Erased {
    // Memory freed, already taken off stored_bytes.
    int64_t bytes = 0;
    // Log bytes its recompute routing's records held, now dead.
    int64_t dead_log_bytes = 0;
  };
  Erased EraseSealed(const std::string& id);
  // The stored sealed `sample` got its last required scalar (an
  // annotation), at `seq` of the store's arrival clock and `now_nanos`:
  // selectable from now on, and a group it completes completed now.
  void MarkReady(const StoredSample& sample, uint64_t seq, int64_t now_nanos);
  // Deletes the open samples among `ids` (their group was dropped); the
  // memory they held, already taken off stored_bytes.
  int64_t EraseOpen(absl::Span<const std::string> ids);

  // Selection's view (scheduler/sample_selection.h).
  //
  // The first required scalar `sample` lacks, or null.
  const std::string* MissingScalar(const StoredSample& sample) const;
  // The sealed `sample` (its arrival `arrival`) as selection sees it.
  SampleCandidate Candidate(const StoredSample& sample, uint64_t arrival) const;
  // Free samples in ingest order as selection sees them, the first `limit`
  // (< 0: all); with `where`, candidate i's entry of free_by_arrival too.
  std::vector<SampleCandidate> FreeCandidates(
      int64_t limit, std::vector<FreeSamples::const_iterator>* where = nullptr) const;
  // The request's selection with the pool's staleness bound where it sets
  // none.
  SelectionRequest Effective(SelectionRequest selection) const;

  // The pool's statistics, as pool `name` (GetPool).
  PoolStats Stats(const std::string& name) const;

  // The pool's state. Public: the store's operations read and change it
  // directly under its lock; the invariants that span several fields are
  // kept by the methods above.
  ModelSpec model;
  PoolOptions options;
  int64_t policy_version = 0;
  absl::flat_hash_map<std::string, Group> groups;
  // Releases from reuse steps, by sample (absent: 0).
  absl::flat_hash_map<std::string, int32_t> uses;
  int64_t stale_dropped = 0;
  int64_t incomplete_groups_dropped = 0;
  bool schema_fixed = false;
  std::map<std::string, FieldSchema> schema;
  // The ragged fields' names every sample carries, once its first sample
  // fixed them (declared `schema`s included).
  std::optional<std::set<std::string>> ragged_schema;
  absl::flat_hash_map<std::string, std::shared_ptr<const StoredSample>> samples;
  // Samples whose pieces are still arriving (lifecycle.md section 5).
  OpenSamples open{&Pool::MemoryBytes};
  // R2: samples' committed recompute routing (counted in stored_bytes).
  RecomputeBook recompute_routing;
  FreeSamples free_by_arrival;
  absl::flat_hash_map<std::string, uint64_t> arrival_of;
  absl::flat_hash_map<std::string, int64_t> arrival_unix_nanos;
  int64_t stored_bytes = 0;
  int64_t live_steps = 0;
  // lifecycle.md section 6 (sample_store_annotations.cc): sealed samples
  // missing a required scalar; when those sealed without one got the last,
  // by id; samples a prepared annotation reserved, by id: its ticket.
  int64_t unannotated = 0;
  absl::flat_hash_map<std::string, Ready> ready_at;
  absl::flat_hash_map<std::string, std::string> reserved;

 private:
  void AddToGroup(const StoredSample& sample, int64_t now_nanos);
  // What the pool keeps about a sealed sample beside it, forgotten as it is
  // erased.
  void ForgetAnnotations(const StoredSample& sample);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_POOL_H_
