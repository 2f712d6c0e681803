// The in-memory store: pools of validated samples under one memory limit,
// and the steps created from them. Thread-safe.
#ifndef ROLLPACK_SERVER_STORE_SAMPLE_STORE_H_
#define ROLLPACK_SERVER_STORE_SAMPLE_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "rollpack/v1/member.pb.h"
#include "rollpack/v1/rollouts.pb.h"
#include "scheduler/model_spec.h"
#include "scheduler/sample_selection.h"
#include "scheduler/topology.h"
#include "server/store/field_schema.h"
#include "server/store/open_samples.h"
#include "server/store/pool_directory.h"
#include "server/store/pool.h"
#include "server/store/pool_options.h"
#include "server/store/scalar_annotation.h"
#include "server/store/step.h"
#include "server/store/step_builder.h"
#include "server/store/step_holds.h"
#include "server/store/stored_sample.h"

namespace rollpack {

struct PutResult {
  int64_t accepted = 0;
  int64_t duplicates = 0;
  int64_t stored_bytes = 0;
};

struct StoreStats {
  int64_t stored_bytes = 0;
  int64_t max_memory_bytes = 0;
  int64_t num_samples = 0;
  int64_t num_live_steps = 0;
};

struct ReleaseResult {
  // Deleted (a reuse step's samples that reached max_uses).
  int released_samples = 0;
  int64_t freed_bytes = 0;
  // Returned to the free set (reuse steps).
  int returned_samples = 0;
};

// What the store deleted on its own (drop_stale, incomplete groups).
struct DropResult {
  int64_t stale_samples = 0;
  int64_t groups = 0;
  int64_t group_samples = 0;
};

// A live step and when it was created (ns since the Unix epoch; a durable
// server's recovered step: when it was recovered).
struct LiveStep {
  std::shared_ptr<const Step> step;
  int64_t created_unix_nanos = 0;
  // Cluster mode: who holds the step's samples (StepInfo.holders).
  struct Holder {
    std::string member;
    int32_t num_samples = 0;
    int64_t num_tokens = 0;
  };
  std::vector<Holder> holders;
};

class DurableLog;

class SampleStore {
 public:
  explicit SampleStore(int64_t max_memory_bytes);

  // Bytes holding `sample` costs in memory, the unit of --max-memory and
  // --max-pool-memory: its object, buffers and map nodes and its entries in
  // the store's indexes, as glibc's malloc sizes them (Pool::MemoryBytes,
  // pool_memory.cc). A function of the sample alone: the same on every run
  // and member.
  static int64_t MemoryBytes(const StoredSample& sample) { return Pool::MemoryBytes(sample); }

  // RESOURCE_EXHAUSTED when RegisterModel would refuse `pool` as one pool
  // too many (--max-pools): asked before a cluster fixes the pool anywhere.
  absl::Status CheckPoolRoom(const std::string& pool) const;
  // OK(true) when the pool was created, OK(false) when it already holds the
  // same model; FAILED_PRECONDITION when it holds a different one, or other
  // `options` (nullopt: whatever options it has, or the defaults for a new
  // pool).
  absl::StatusOr<bool> RegisterModel(const std::string& pool, const ModelSpec& model,
                                     const std::optional<PoolOptions>& options = std::nullopt);
  // NOT_FOUND when the pool has no registered model.
  absl::StatusOr<PoolOptions> GetOptions(const std::string& pool) const;

  // NOT_FOUND when the pool has no registered model.
  absl::StatusOr<ModelSpec> GetModel(const std::string& pool) const;

  // Where pools this store has not seen are looked up and, where it fixes
  // them, a pool's fields before its first batch here (pool_directory.h: a
  // cluster's, in etcd). Set once before serving, read without the lock;
  // null (a store alone): every pool is registered here, and its first
  // accepted sample fixes its fields. `pools` must outlive the store's calls.
  void AttachPoolDirectory(PoolDirectory* pools) { pool_directory_ = pools; }
  // GetModel; for a pool unknown here, the directory's definition,
  // registered here first (a pool registered on another member takes
  // samples on this one).
  absl::StatusOr<ModelSpec> GetOrAdoptModel(const std::string& pool);

  // Commits already-validated samples all or nothing: INVALID_ARGUMENT when
  // a sample's token fields differ from the pool's (fixed by the first
  // accepted sample) or the batch repeats an id with other content;
  // ALREADY_EXISTS when an id is stored with other content;
  // RESOURCE_EXHAUSTED when the batch does not fit under the memory limit.
  // Identical re-sends are counted as duplicates and stored once.
  absl::StatusOr<PutResult> Put(const std::string& pool,
                                std::vector<StoredSample> samples);

  absl::StatusOr<PoolStats> GetPool(const std::string& pool) const;

  // Where a sample sent in pieces stands (lifecycle.md section 5), for a
  // producer that extends it without keeping its own copy (the capture
  // port's sessions): its tokens so far, where its routing rows end (-1:
  // none yet), the pieces stored and its scalars. NOT_FOUND when `pool` has
  // no sample `sample_id`; FAILED_PRECONDITION when it is sealed.
  using OpenSampleState = ::rollpack::OpenSampleState;
  absl::StatusOr<OpenSampleState> GetOpenSample(const std::string& pool,
                                                const std::string& sample_id) const;
  // Names of the pools with a registered model, sorted.
  std::vector<std::string> PoolNames() const;

  // Bytes one pool may hold (--max-pool-memory); 0 = only the server-wide
  // limit. Past it Put returns RESOURCE_EXHAUSTED naming the pool.
  void set_max_pool_bytes(int64_t bytes);
  // Pools this store may hold (0 = no limit); RegisterModel of one more is
  // RESOURCE_EXHAUSTED. Pool names are bounded too (names.h).
  void set_max_pools(int64_t pools);
  int64_t max_pool_bytes() const;
  StoreStats Stats() const;

  // Takes samples out of the pool's free samples (the given ids, or the
  // oldest `num_samples` free ones), plans them and builds the layout.
  // ALREADY_EXISTS for a live step id; NOT_FOUND for an unknown pool or
  // sample; FAILED_PRECONDITION for a sample already in a live step or too
  // few free samples; INVALID_ARGUMENT for topologies the model or plan
  // refuses. Nothing changes on error.
  // Selections by groups, tokens, versions and staleness, and reuse steps:
  // lifecycle.md (its refusals, FAILED_PRECONDITION or INVALID_ARGUMENT).
  absl::StatusOr<std::shared_ptr<const Step>> CreateStep(const StepRequest& request);
  // The plain form: explicit ids, or the oldest `num_samples`.
  absl::StatusOr<std::shared_ptr<const Step>> CreateStep(
      const std::string& step_id, const std::string& pool,
      absl::Span<const std::string> sample_ids, int num_samples,
      const Topology& topology);

  // Records the trainer's policy version (a lower one changes nothing) and,
  // with the pool's drop_stale, deletes its free stale samples (durably,
  // counted). NOT_FOUND for an unknown pool. The pool's stats after it.
  absl::StatusOr<PoolStats> SetPolicyVersion(const std::string& pool, int64_t policy_version);
  // Deletes the free samples of groups that stayed incomplete past their
  // pool's incomplete_group_timeout_ms at `now` (the server calls it
  // periodically).
  absl::StatusOr<DropResult> DropExpiredGroups(absl::Time now);
  // The two halves of it, for a cluster member that checks the candidates
  // against the other members first (a group may be complete over them):
  // groups incomplete here past their timeout, by pool; and the deletion of
  // those of `group_ids` still incomplete here.
  std::map<std::string, std::vector<std::string>> ExpiredGroups(absl::Time now) const;
  // `count`: this member counts the drop (in a cluster, one member counts a
  // group spread over several).
  absl::StatusOr<DropResult> DropGroups(const std::string& pool,
                                        const std::vector<std::string>& group_ids, bool count);

  // NOT_FOUND naming the step when it is not live.
  absl::StatusOr<std::shared_ptr<const Step>> GetStep(const std::string& step_id) const;
  // The live steps (of `pool`; "" = every pool), by step id. A cluster
  // member's holds are not steps.
  std::vector<LiveStep> ListSteps(const std::string& pool) const;
  // When the live step was created here; 0 when it is not live.
  int64_t StepCreatedUnixNanos(const std::string& step_id) const;

  // Deletes the step (or this member's hold of a cluster step) and its
  // samples, freeing their memory; a reuse step's samples go back to the
  // free set (in their ingest order) unless they reached max_uses.
  absl::StatusOr<ReleaseResult> ReleaseStep(const std::string& step_id);
  // The same for this member's hold of a cluster step only (Member.
  // ReleaseHold): NOT_FOUND for any other id, a step of this server's own
  // included, so a peer cannot release what it did not hold.
  absl::StatusOr<ReleaseResult> ReleaseHold(const std::string& step_id);

  // Cluster mode (server/cluster/cluster_steps.h): a step planned over
  // several members holds, on each, the samples that member stores. These
  // calls are the member's side of that, implemented in
  // sample_store_holds.cc. A hold is durable like a step (logged), and is
  // "unconfirmed" until the planner says the step was committed (or a
  // restart forgot that): unconfirmed holds are what a member checks
  // against the cluster's record of steps.
  struct SampleListing {
    std::vector<std::string> sample_ids;
    std::vector<int64_t> num_tokens;
    std::vector<int64_t> arrival_unix_nanos;
    std::vector<bool> free;
    // Lifecycle metadata (every listing carries it).
    std::vector<std::string> group_ids;
    std::vector<int32_t> group_sizes;
    std::vector<int64_t> policy_versions;
    // Explicit ids that are open samples here (not selectable).
    std::vector<std::string> open_sample_ids;
    // lifecycle.md section 6, per listed sample: the first required scalar
    // it lacks ("" = none), and when it became selectable (its arrival, or
    // the annotation that gave it its last required scalar).
    std::vector<std::string> missing_scalars;
    std::vector<int64_t> ready_unix_nanos;
  };
  // Explicit ids: those stored here (free or not), in the order given.
  // Otherwise the oldest free samples, at most `limit` (< 0: all). NOT_FOUND
  // for an unknown pool.
  absl::StatusOr<SampleListing> ListSamples(const std::string& pool,
                                            absl::Span<const std::string> sample_ids,
                                            int limit) const;
  // Takes the samples out of the free ones for `step_id`, all or nothing.
  // ALREADY_EXISTS for a step id live here; NOT_FOUND / FAILED_PRECONDITION
  // naming a sample that is not stored here / is in a step already.
  // `attempt` names the planner's attempt at the step (its record's
  // created_unix_nanos), which alone may confirm the hold.
  // With `recompute` (a RECOMPUTE step): FAILED_PRECONDITION naming the
  // first sample without recompute routing; the hold keeps each one's.
  absl::Status Hold(const std::string& step_id, const std::string& pool,
                    absl::Span<const std::string> sample_ids, const std::string& coordinator,
                    int64_t attempt, bool reuse_samples = false, bool recompute = false);
  // The attempt of the hold of `step_id`, 0 when there is none.
  int64_t HoldAttempt(const std::string& step_id) const;
  // NOT_FOUND when there is no such hold.
  absl::Status ConfirmHold(const std::string& step_id);
  // Gives the held samples back to the free ones, in their arrival order.
  // With `attempt` != 0, only that attempt's hold (NOT_FOUND otherwise).
  absl::StatusOr<ReleaseResult> DropHold(const std::string& step_id, int64_t attempt = 0);
  // The held samples of `step_id` among `sample_ids` (all must be held by
  // it): NOT_FOUND naming the step or the sample otherwise.
  absl::StatusOr<std::vector<std::shared_ptr<const StoredSample>>> HeldSamples(
      const std::string& step_id, absl::Span<const std::string> sample_ids) const;
  // Unconfirmed holds taken at least `age` ago, by step id.
  std::vector<std::string> UnconfirmedHolds(absl::Duration age) const;
  // Step ids of every hold, confirmed or not.
  std::vector<std::string> HoldIds() const;

  // Durable mode: from now on every mutation is written to `log` before it
  // is acknowledged (see server/store/durable_log.h); a mutation the log refuses
  // fails with the log's status and changes nothing. Call before serving,
  // after replaying the log into this store. `log` must outlive the store.
  void AttachLog(DurableLog* log) { log_ = log; }
  // Rewrites the log from the live state (released steps' samples drop
  // out). ReleaseStep calls it when the log's dead bytes pass its limits.
  absl::Status CompactLog();

  // Replaying the log (log_replay.cc): the records the lifecycle calls
  // above wrote, applied as they were.
  absl::Status ReplayPolicyVersion(const std::string& pool, int64_t policy_version);
  absl::Status ReplayDrop(const v1::DroppedSamplesRecord& record);
  absl::Status ReplayUses(const v1::SampleUsesRecord& record);

  // Scalars added after the fact (lifecycle.md section 6), in
  // sample_store_annotations.cc. All or nothing, durably; returns the
  // number of entries (no-op entries included). NOT_FOUND for an unknown
  // pool or sample; INVALID_ARGUMENT for an id twice; FAILED_PRECONDITION
  // naming the step of a sample in a live step (or hold), or naming sample,
  // scalar and both values for a scalar set to another value (the same
  // value, bit for bit, is a no-op); ABORTED naming a sample another
  // annotation has reserved (retry); RESOURCE_EXHAUSTED past the memory
  // limit. Open samples take annotations too.
  absl::StatusOr<int32_t> AnnotateSamples(const std::string& pool,
                                          absl::Span<const ScalarAnnotation> annotations);
  // The same in two phases, for a cluster's AnnotateSamples over several
  // members (Member.PrepareAnnotations, Commit, Abort). Prepare checks as
  // AnnotateSamples does and reserves the samples for `ticket` until commit,
  // abort or `ttl` passes: meanwhile CreateStep and Hold refuse them, and
  // so do other annotations and a later piece that sets a reserved name
  // (ABORTED, naming the sample). A prepare again of a live ticket is OK.
  absl::Status PrepareAnnotations(const std::string& pool, const std::string& ticket,
                                  std::vector<ScalarAnnotation> annotations, absl::Duration ttl);
  // Applies the prepared annotations durably and frees the reservation;
  // returns the entries applied (those of samples deleted meanwhile left
  // out). A commit again answers as the first; FAILED_PRECONDITION for an
  // unknown or expired ticket.
  absl::StatusOr<int32_t> CommitAnnotations(const std::string& pool, const std::string& ticket);
  // Frees the reservation; OK for an unknown ticket (an abort again).
  absl::Status AbortAnnotations(const std::string& pool, const std::string& ticket);
  absl::Status ReplayAnnotations(const v1::AnnotationsRecord& record);

  // R2 (docs/layout.md section 11), in sample_store_routing.cc.
  // Gives the samples of the live step `step_id` their recompute routing
  // (`routing[i]` for the step's sample i: [n_i, stored layers, K] ids of
  // the store's width), durably, replacing any they had. NOT_FOUND when the
  // step is not live here; INVALID_ARGUMENT when the sizes do not match the
  // samples; RESOURCE_EXHAUSTED when it does not fit under the memory
  // limit. Nothing changes on error. Returns the bytes now stored.
  // `step` must still be the live step of its id (FAILED_PRECONDITION when
  // it was released, or released and created again).
  absl::StatusOr<int64_t> SetRecomputeRouting(const std::shared_ptr<const Step>& step,
                                              std::vector<std::string> routing);
  // The same for samples this member holds for a cluster step (the hold of
  // `attempt`): `routing[i]` is `sample_ids[i]`'s, every id held by it.
  absl::StatusOr<int64_t> SetHeldRecomputeRouting(const std::string& step_id, int64_t attempt,
                                                  absl::Span<const std::string> sample_ids,
                                                  std::vector<std::string> routing);
  // The recompute routing a RECOMPUTE hold took with `sample_ids` (all held
  // by it), in their order: NOT_FOUND naming the step or sample, or
  // FAILED_PRECONDITION when the hold replays rollout routing.
  absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> HeldRecomputeRouting(
      const std::string& step_id, absl::Span<const std::string> sample_ids) const;
  absl::Status ReplayRecomputeRouting(const v1::RecomputeRoutingRecord& record);
  // Memory held outside the samples on the store's behalf (R2 upload
  // stages), counted against --max-memory like samples: RESOURCE_EXHAUSTED
  // naming `what` when it does not fit.
  absl::Status ReserveMemory(int64_t bytes, const std::string& what);
  void ReleaseMemory(int64_t bytes);

  // Whole pools (sample_store_pools.cc).
  struct PoolDeletion {
    // Samples (sealed and open) and bytes deleted.
    int64_t samples = 0;
    int64_t bytes = 0;
    // The live steps and holds of the pool `force` ended, by id.
    std::vector<std::string> ended_steps;
  };
  // Deletes `pool` with every sample it holds (free, in steps, open), their
  // recompute routing and the annotations prepared for them, durably (a
  // kDeletePool record that replay applies again), so that the name can be
  // registered again with another model. NOT_FOUND for an unknown pool;
  // FAILED_PRECONDITION naming the pool's live steps and holds unless
  // `force`, which ends them first (their samples are deleted, not
  // returned); ABORTED while a step of the pool is being created. With
  // `dry_run`: what it would delete, and the same refusals, changing nothing.
  absl::StatusOr<PoolDeletion> DeletePool(const std::string& pool, bool force,
                                          bool dry_run = false);
  // A page of the pool's samples' metadata (sealed and open) in sample id
  // order: ids after `after` ("" = from the first), at most `limit`, only
  // those in `state` (UNSPECIFIED: any) and of `group_id` ("" = any).
  // `more`: later ids match too. NOT_FOUND for an unknown pool.
  struct SamplePageRequest {
    std::string after;
    int32_t limit = 100;
    v1::SampleState state = v1::SAMPLE_STATE_UNSPECIFIED;
    std::string group_id;
  };
  struct SamplePage {
    std::vector<v1::SampleInfo> samples;
    bool more = false;
  };
  absl::StatusOr<SamplePage> ListSamplePage(const std::string& pool,
                                            const SamplePageRequest& request) const;
  // Of `group_ids`, the groups complete here (every sealed sample that
  // counts, none missing), in id order: a cluster asks this of the groups
  // incomplete on other members, since a group complete here with more
  // samples elsewhere is over-full, not incomplete. NOT_FOUND for an
  // unknown pool.
  absl::StatusOr<std::vector<GroupShareStats>> CompleteGroups(
      const std::string& pool, const std::vector<std::string>& group_ids) const;

 private:
  // A prepared annotation (PrepareAnnotations): its samples are reserved
  // until it is committed, aborted or expires.
  struct AnnotationTicket {
    std::string pool;
    std::vector<ScalarAnnotation> annotations;
    absl::Time expires;
  };

  // A piece message or an open sample's snapshot, planned by the pool's
  // OpenSamples (sample_store_lifecycle.cc), with the pool's sealed sample of
  // its id and a prepared annotation of it: what storing `piece` would do,
  // or the refusal (lifecycle.md section 5); changes nothing.
  absl::StatusOr<OpenSamples::Plan> PlanPiece(const std::string& pool_name, const Pool& pool,
                                              const StoredSample& piece) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  absl::StatusOr<PutResult> PutLocked(const std::string& pool,
                                      std::vector<StoredSample> samples,
                                      std::string encoded, int64_t* ticket);
  absl::StatusOr<ReleaseResult> ReleaseStepLocked(const std::string& step_id, bool holds_only,
                                                  int64_t* ticket);
  // Makes a release durable (log sync), then compacts the log if due.
  absl::Status SyncRelease(int64_t ticket);
  // Deletes the samples of a released step or hold from their pool.
  ReleaseResult EraseSamples(Pool& pool, absl::Span<const std::string> sample_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A released step's or hold's samples: erased, or with `reuse` counted
  // and returned to the free ones (erased past max_uses).
  ReleaseResult ReleaseSamples(Pool& pool, absl::Span<const std::string> sample_ids, bool reuse)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Annotations (sample_store_annotations.cc): the checks of AnnotateSamples
  // (`ticket`: the caller's own reservation, "" for none) with the bytes the
  // new scalars add; their application, logged first unless replaying.
  absl::Status CheckAnnotations(const std::string& pool_name, const Pool& pool,
                                absl::Span<const ScalarAnnotation> annotations,
                                const std::string& ticket, absl::Time now,
                                int64_t* new_bytes) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status ApplyAnnotations(const std::string& pool_name, Pool& pool,
                                absl::Span<const ScalarAnnotation> annotations, bool log,
                                int64_t* ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live prepared annotation that reserved sample `id`, or null; with
  // `entry`, the sample's entry in it.
  const AnnotationTicket* ReservationOf(const Pool& pool, absl::string_view id, absl::Time now,
                                        const ScalarAnnotation** entry = nullptr) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // ABORTED naming the first of the samples a live reservation holds.
  absl::Status CheckUnreserved(const Pool& pool, const std::string& step_id,
                               absl::Span<const SampleCandidate> candidates,
                               absl::Span<const int32_t> chosen) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Raises the pool's policy version; with drop_stale deletes free stale
  // samples. Logs both; *ticket is the last record's.
  absl::StatusOr<DropResult> AdvanceVersionLocked(const std::string& pool_name, Pool& pool,
                                                  int64_t policy_version, int64_t* ticket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes free samples (and a dropped group's open ones) for `reason`,
  // logged first.
  absl::Status DropFreeLocked(const std::string& pool_name, Pool& pool,
                              const std::vector<std::string>& ids, int reason,
                              const std::vector<std::string>& groups, bool count_groups,
                              int64_t* ticket,
                              const std::vector<std::string>& open_ids = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts samples back among the free ones (in ingest order), except those
  // of a group already dropped as incomplete: deleted instead (their group
  // can never be whole again). `log_drop`: the caller's own record does not
  // imply the deletion, so a drop record is written for it.
  absl::StatusOr<ReleaseResult> ReturnToFree(const std::string& pool_name, Pool& pool,
                                             absl::Span<const std::string> ids, bool log_drop)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<ReleaseResult> ReleaseHoldLocked(const std::string& step_id, int64_t* ticket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when every id is stored in `pool`, free and listed once; else the
  // error naming the first that is not (INVALID_ARGUMENT, NOT_FOUND,
  // FAILED_PRECONDITION).
  absl::Status CheckFree(const Pool& pool, const std::string& pool_name,
                         const std::string& step_id,
                         absl::Span<const std::string> sample_ids) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Before a pool's first batch here: the cluster's schema becomes the pool's
  // (sample_store_pools.cc).
  absl::Status FixSchemaClusterWide(const std::string& pool,
                                    const std::vector<StoredSample>& samples);
  // Stores `routing` as the recompute routing of `sample_ids` (all in
  // `pool`, sizes checked), replacing and accounting memory and dead log
  // bytes.
  void StoreRecomputeRouting(Pool& pool, absl::Span<const std::string> sample_ids,
                             std::vector<std::string> routing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks sizes and limits, logs (*ticket: the last record's) and stores a
  // commit's routing; nothing changes on error. The bytes now stored.
  absl::StatusOr<int64_t> CommitRoutingLocked(const std::string& pool_name,
                                              const std::string& step_id,
                                              absl::Span<const std::string> sample_ids,
                                              std::vector<std::string> routing, int64_t* ticket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaying the log: parts of a multi-record commit seen so far, by step.
  absl::flat_hash_map<std::string, std::vector<v1::RecomputeRoutingRecord>> pending_routing_
      ABSL_GUARDED_BY(mu_);
  absl::Status ApplyRoutingRecord(const v1::RecomputeRoutingRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_memory_bytes_;
  DurableLog* log_ = nullptr;
  // Set once before serving (AttachPoolDirectory), read without the lock.
  PoolDirectory* pool_directory_ = nullptr;
  mutable absl::Mutex mu_;
  std::map<std::string, Pool> pools_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<const Step>> steps_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> step_created_unix_nanos_ ABSL_GUARDED_BY(mu_);
  // This member's holds of cluster steps (step_holds.h).
  StepHolds holds_ ABSL_GUARDED_BY(mu_);
  // Step ids being planned (and their pools), reserved so two creates
  // cannot race and their pool is not deleted under them.
  absl::flat_hash_map<std::string, std::string> pending_steps_ ABSL_GUARDED_BY(mu_);
  int64_t stored_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_pool_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status PoolRoomLocked(const std::string& pool) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int64_t max_pools_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_arrival_ ABSL_GUARDED_BY(mu_) = 0;
  // Prepared annotations by ticket; committed tickets and what they
  // answered, the latest kept for retries (sample_store_annotations.cc).
  absl::flat_hash_map<std::string, AnnotationTicket> annotation_tickets_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int32_t> committed_tickets_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> committed_order_ ABSL_GUARDED_BY(mu_);
  void ExpireTicketsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_SAMPLE_STORE_H_
