// Steps over the whole cluster (docs/cluster.md, "Steps"): the member a
// CreateStep reaches plans over the samples of every live member from
// their metadata alone, takes the samples on the members that hold them,
// and commits the step by creating its record in etcd, which is what makes
// the step exist for every member. GetPlan, FetchMicrobatches and
// ReleaseStep then work through any member: a member serving a rank pulls
// the samples that rank receives from their owners (member.proto,
// ReadSamples) and encodes them exactly as a single server holding them
// would.
//
// Taking samples is a two-step protocol with etcd as the one decision:
//  1. the planner asks every owner to hold its samples for the step; an
//     owner holds all of them or none, so two steps racing for a sample
//     never both get it, and a refusal makes the planner drop the holds it
//     got;
//  2. the planner creates /NAME/steps/<id> (create-if-absent). A member
//     whose hold stays unconfirmed (the planner died, or lost etcd) tries
//     to create the same key as a tombstone: exactly one of the two wins,
//     and the hold is confirmed or dropped accordingly.
// Releasing writes /NAME/releases/<owner>/<id> for every owner before it
// deletes the record, so an owner that is down finishes the release when
// it is back.
#ifndef ROLLPACK_SERVER_CLUSTER_CLUSTER_STEPS_H_
#define ROLLPACK_SERVER_CLUSTER_CLUSTER_STEPS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rollpack/v1/member.pb.h"
#include "server/cluster/cluster.h"
#include "server/store/sample_store.h"
#include "server/store/step_activity.h"
#include "server/store/step_directory.h"

namespace rollpack {

struct ClusterStepsOptions {
  // A hold unconfirmed this long is checked against etcd (the planner
  // commits within a few seconds or not at all).
  absl::Duration hold_grace = absl::Seconds(10);
  // How long a tombstone keeps an abandoned step id refused.
  absl::Duration tombstone_ttl = absl::Seconds(60);
  // Background work (pending releases, stale holds, cached plans).
  absl::Duration tick = absl::Seconds(1);
  // One member-to-member call; a member that does not answer in time is
  // UNAVAILABLE naming it.
  absl::Duration member_timeout = absl::Seconds(5);
  // Pulling one rank's samples from one owner, in all...
  absl::Duration pull_timeout = absl::Seconds(120);
  // ...and between two of its messages: an owner that stops sending is
  // given up after this long, UNAVAILABLE naming it (stall_watch.h). A
  // message is 4 MiB of samples plus at most one sample: 15 s carries a
  // 512 MiB sample over a 1 Gb/s link with room to spare.
  absl::Duration pull_stall_timeout = absl::Seconds(15);
};

class ClusterSteps final : public StepDirectory {
 public:
  explicit ClusterSteps(SampleStore* store, ClusterStepsOptions options = {});
  ~ClusterSteps() override;
  ClusterSteps(const ClusterSteps&) = delete;
  ClusterSteps& operator=(const ClusterSteps&) = delete;

  // Serves through `cluster` (joined) and starts the background work. Until
  // then, and after Detach, every call is UNAVAILABLE.
  void Attach(Cluster* cluster);
  void Detach();
  // The cluster attached (null before Attach and after Detach).
  Cluster* cluster() const { return cluster_.load(); }

  absl::StatusOr<std::shared_ptr<const Step>> CreateStep(const StepRequest& request) override;
  absl::StatusOr<std::shared_ptr<const Step>> GetStep(const std::string& step_id) override;
  absl::StatusOr<RankStep> GetStepForRank(const std::string& step_id,
                                          const RankCoords& coords) override;
  // Only this member's own samples: nothing is pulled from other members.
  absl::StatusOr<RankPieces> GetPiecesForRank(const std::string& step_id,
                                              const RankCoords& coords) override;
  absl::StatusOr<ReleaseResult> ReleaseStep(const std::string& step_id) override;
  // Every committed step of the cluster (etcd's records), planned here from
  // their records when this member has not seen them yet.
  absl::StatusOr<std::vector<LiveStep>> ListSteps(const std::string& pool) override;
  int64_t CreatedUnixNanos(const std::string& step_id) override;
  // The members of the step's record holding its samples (cluster_steps_census.cc).
  std::vector<LiveStep::Holder> StepHolders(const std::string& step_id) override;
  // Every live member records the version (and drops its own stale samples
  // with drop_stale); UNAVAILABLE naming a member that does not answer (a
  // retry is harmless). The cluster's pool afterwards.
  absl::StatusOr<v1::PoolInfo> SetPolicyVersion(const std::string& pool, int64_t policy_version,
                                                bool local_only) override;
  bool MayBlock() const override { return true; }
  // R2 over the cluster (docs/recompute.md, "In a cluster"; in
  // cluster_steps_routing.cc): an upload is checked here, split by owner
  // and staged on every owner of its rows; a commit checks every owner's
  // stage complete, then has each store its samples' routing. UNAVAILABLE
  // naming an owner that does not answer.
  absl::StatusOr<RoutingUploadResult> UploadRouting(const std::string& step_id,
                                                    const RankCoords& coords, int microbatch,
                                                    const UploadedRouting& upload) override;
  absl::StatusOr<RoutingCommitResult> CommitRouting(const std::string& step_id) override;
  // The owner's side (member.proto StageRouting, CheckRouting, CommitRouting),
  // against this member's hold of the step's `attempt`.
  absl::StatusOr<RoutingUploadResult> StageHeldRouting(const v1::StageRoutingRequest& request);
  absl::StatusOr<RoutingCommitResult> CheckHeldRouting(const std::string& step_id,
                                                       int64_t attempt);
  absl::StatusOr<RoutingCommitResult> CommitHeldRouting(const std::string& step_id,
                                                        int64_t attempt);
  // Gives back the memory of R2 stages whose holds were released or dropped
  // (also done every tick).
  void DropStaleRoutingStages();

  // Bytes this member exchanged with the others to plan steps (listings
  // received, holds sent: metadata only), and bytes of samples it pulled
  // from other members to serve ranks (metrics, bench).
  int64_t planning_bytes() const { return planning_bytes_.load(); }
  int64_t pulled_bytes() const { return pulled_bytes_.load(); }

  // In cluster_steps_loss.cc (docs/cluster.md, "Data loss"). The incarnation
  // this member runs as ("" before Attach).
  std::string incarnation() const;
  // `missing` (a hold of the step not found here), or DATA_LOSS naming the
  // step, this member and `sample_ids` when the step's record says another
  // incarnation of this member held its samples: they went with its data.
  absl::Status ExplainMissingHold(const std::string& step_id,
                                  const std::vector<std::string>& sample_ids,
                                  absl::Status missing);
  // Samples of live steps lost here, counted once cluster-wide, by pool
  // (rollpack_cluster_lost_samples_total).
  std::map<std::string, int64_t> lost_samples() const;

  // In cluster_steps_census.cc (docs/cluster.md, "Counting steps"): the
  // cluster's live steps by pool, each committed step record once however
  // many members hold its samples, plus the steps this member made before
  // it joined. Read from etcd now (GetPool)...
  absl::StatusOr<std::map<std::string, int64_t>> RefreshCensus();
  // ...or as the upkeep last read it, every tick (metrics); nullopt until
  // it has.
  std::optional<std::map<std::string, int64_t>> LiveStepsByPool() const;
  // --step-ttl over the cluster (cluster_steps_expiry.cc): on the first live
  // member by id, releases every cluster step idle for `ttl` on every member
  // (this one's `activity`, the others' Member.StepStreams); on every member,
  // its own steps made before joining. The steps released, with what each
  // release freed.
  std::vector<std::pair<std::string, ReleaseResult>> ExpireIdleSteps(StepActivity* activity,
                                                                     absl::Duration ttl);
  // The members holding a record's samples, with their shares (StepInfo.holders).
  static std::vector<LiveStep::Holder> Holders(const v1::ClusterStepRecord& record);

 private:
  // A committed step as this member knows it: the plan rebuilt from the
  // record, and the samples pulled so far to serve ranks.
  struct CachedStep {
    // The etcd modification revision of the record this was built from:
    // a record put over (edited by hand, forged) or deleted and created
    // again has another, and is read, checked and planned again.
    int64_t revision = 0;
    v1::ClusterStepRecord record;
    std::shared_ptr<const Step> step;
    // record.owner(), shared with the piece streams (GetPiecesForRank).
    std::shared_ptr<const std::vector<int32_t>> owner;
    absl::Mutex mu;
    std::vector<std::shared_ptr<const StoredSample>> samples ABSL_GUARDED_BY(mu);
    // RECOMPUTE steps: the samples' recompute routing, pulled with them.
    std::vector<std::shared_ptr<const std::string>> routing ABSL_GUARDED_BY(mu);
    bool recompute() const { return step->replay.source == ReplaySourceKind::kRecompute; }
  };

  // The samples a CreateStep takes, in the step's order (cluster_choice.cc).
  struct Choice {
    std::vector<std::string> members;
    std::vector<std::string> sample_ids;
    std::vector<int64_t> num_tokens;
    std::vector<int32_t> owner;
    int32_t num_groups = 0;
    // Each sample's listed group, its size and policy version (lifecycle.md
    // section 6: every micro-batch says them; advantages group by them).
    std::vector<std::string> group_ids;
    std::vector<int32_t> group_sizes;
    std::vector<int64_t> policy_versions;
  };
  // Per member of a record, the scalars of the samples it held, in the
  // order it was asked; nullopt: it did not say them (an older rollpackd).
  using HeldScalars = std::vector<std::optional<std::vector<std::map<std::string, double>>>>;

  absl::StatusOr<Cluster*> Joined() const;
  std::string StepKey(Cluster* cluster, const std::string& step_id) const;
  std::string ReleaseKey(Cluster* cluster, const std::string& member,
                         const std::string& step_id) const;

  // DATA_LOSS naming the step, the sample and both lengths unless every
  // sample holds as many tokens as the record says for its sequence.
  static absl::Status CheckLengths(const v1::ClusterStepRecord& record,
                                   const std::vector<int>& sequences,
                                   const std::vector<std::shared_ptr<const StoredSample>>& samples);
  // The committed record of the step, and with `mod_revision` the etcd
  // revision of those bytes; NOT_FOUND when there is none (or a tombstone).
  absl::StatusOr<v1::ClusterStepRecord> ReadRecord(Cluster* cluster, const std::string& step_id,
                                                  int64_t* mod_revision = nullptr);
  // The step as its record in etcd is now: the cached plan while the
  // record's modification revision is the one it was built from (one
  // keys-only read), else the record read, checked (StepFromRecord) and
  // planned again. With etcd away, the plan last built.
  absl::StatusOr<std::shared_ptr<CachedStep>> Find(const std::string& step_id);
  // A CachedStep of `record` at `revision`, its sample slots empty.
  static std::shared_ptr<CachedStep> NewCachedStep(int64_t revision, v1::ClusterStepRecord record,
                                                   std::shared_ptr<const Step> step);
  // Selects over every member's listing (lifecycle.md holds cluster-wide:
  // a group's samples may sit on several members).
  absl::StatusOr<Choice> Choose(Cluster* cluster, const std::vector<ClusterMember>& members,
                                const StepRequest& request, const SelectionRequest& selection);
  // In cluster_steps_holds.cc (with DropAll and ConfirmAll). *incarnations:
  // per member of the record, the incarnation that took its hold ("" where
  // none was taken or the member did not say one).
  absl::Status HoldAll(Cluster* cluster, const v1::ClusterStepRecord& record,
                       HeldScalars* scalars, std::vector<std::string>* incarnations);
  // In cluster_step_metadata.cc: the scalars a member's HoldSamples answer
  // says (DATA_LOSS naming it for another count than `count`), and those
  // this member's own hold took.
  static absl::Status ScalarsOfHold(
      const v1::HoldSamplesResponse& response, const std::string& member, size_t count,
      std::optional<std::vector<std::map<std::string, double>>>* out);
  absl::Status OwnHeldScalars(const std::string& step_id, const std::vector<std::string>& ids,
                              std::optional<std::vector<std::map<std::string, double>>>* out);
  // The step's per-sequence metadata and advantages (StepMetadata) from the
  // listings and the holds' scalars: FAILED_PRECONDITION naming a member
  // that said no scalars when the step has an estimator, or the estimator's
  // refusals. With `scalars` null, only the estimator's group checks (before
  // anything is held).
  absl::StatusOr<StepMetadata> ChoiceMetadata(const Choice& choice,
                                              const v1::ClusterStepRecord& record,
                                              const HeldScalars* scalars,
                                              const StepRequest& request);
  void DropAll(Cluster* cluster, const v1::ClusterStepRecord& record);
  void ConfirmAll(Cluster* cluster, const v1::ClusterStepRecord& record);
  // The samples of `sequences` from their owner, and (RECOMPUTE steps)
  // their recompute routing.
  absl::Status Pull(Cluster* cluster, const CachedStep& step, int owner,
                    const std::vector<int>& sequences,
                    std::vector<std::shared_ptr<const StoredSample>>* out,
                    std::vector<std::shared_ptr<const std::string>>* routing);
  // This member's share of a cluster step it holds samples of.
  absl::StatusOr<HeldStep> HeldShare(const std::string& step_id, int64_t attempt);
  // One phase of a commit (check, or with `commit` store) on every owner of
  // the step's samples; `committed_on` lists the members that stored.
  absl::StatusOr<RoutingCommitResult> CommitPhase(
      Cluster* cluster, const CachedStep& step, bool commit,
      std::vector<std::string>* committed_on);

  // This member's share of a step that an earlier incarnation of it held.
  struct LostShare {
    std::string member;
    std::string then;  // the incarnation the record names
    std::string now;   // this one
    std::vector<std::string> sample_ids;
  };
  std::optional<LostShare> LostHere(const v1::ClusterStepRecord& record) const;
  // `missing` (the store's answer for a hold of the record's step), or
  // LostError when LostHere.
  absl::Status MissingHere(const v1::ClusterStepRecord& record,
                           const std::vector<std::string>& sample_ids,
                           absl::Status missing) const;
  static absl::Status LostError(const v1::ClusterStepRecord& record, const LostShare& lost,
                                const std::vector<std::string>& asked);
  // Once after Attach (retried while etcd is away): every live step whose
  // samples here went with an earlier incarnation, logged and counted.
  void ReportLostShares(Cluster* cluster);
  bool lost_shares_reported_ = false;  // background thread only
  mutable absl::Mutex lost_mu_;
  std::map<std::string, int64_t> lost_samples_ ABSL_GUARDED_BY(lost_mu_);

  struct CensusEntry {
    int64_t revision = 0;  // of the record's bytes when they were read
    bool live = false;     // a committed step (not a tombstone, not junk)
    std::string pool;
  };
  mutable absl::Mutex census_mu_;
  std::map<std::string, CensusEntry> census_ ABSL_GUARDED_BY(census_mu_);
  std::optional<std::map<std::string, int64_t>> census_counts_ ABSL_GUARDED_BY(census_mu_);

  void BackgroundLoop();
  // False when etcd could not be read (the tick stops there).
  bool FinishPendingReleases(Cluster* cluster);
  void ResolveStaleHolds(Cluster* cluster);
  // A confirmed hold whose step record is gone (deleted by hand, or lost
  // with etcd's data) with no release pending: released as if ReleaseStep
  // had been called, once the record has been missing for hold_grace (a
  // ReleaseStep in flight deletes the record before it reaches the owners).
  void ReleaseOrphanedHolds(Cluster* cluster);
  void PruneCache(Cluster* cluster);
  // Groups incomplete here past their pool's timeout, dropped only when
  // every member answers and they are incomplete over the whole cluster.
  void DropExpiredGroups(Cluster* cluster);
  // Only the background thread reads and writes these.
  absl::Time next_group_check_ = absl::InfinitePast();
  std::map<std::string, absl::Time> record_missing_since_;

  SampleStore* const store_;
  const ClusterStepsOptions options_;
  // R2 stages: of steps made here before joining, and of this member's
  // shares of cluster steps.
  RecomputeUploads uploads_;
  std::atomic<Cluster*> cluster_{nullptr};
  std::atomic<int64_t> planning_bytes_{0};
  std::atomic<int64_t> pulled_bytes_{0};

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<CachedStep>> cache_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread background_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_CLUSTER_STEPS_H_
