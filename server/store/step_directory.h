// Where the scheduler and trainer services find steps: the store itself on
// a single server (LocalSteps), the cluster on a member of one
// (server/cluster/cluster_steps.h), whose steps' samples are spread over
// the members that received them.
#ifndef ROLLPACK_SERVER_STORE_STEP_DIRECTORY_H_
#define ROLLPACK_SERVER_STORE_STEP_DIRECTORY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/layout.h"
#include "scheduler/topology.h"
#include "server/store/pool_info.h"
#include "server/store/recompute_uploads.h"
#include "server/store/sample_store.h"
#include "server/store/step.h"

namespace rollpack {

// A step with the samples one rank receives at hand.
struct RankStep {
  std::shared_ptr<const Step> step;
  // samples->at(i) is the step's sequence i wherever the rank receives it;
  // null when the step holds its samples itself (step->samples).
  std::shared_ptr<const std::vector<std::shared_ptr<const StoredSample>>> samples;
  // R2: recompute_routing->at(i) is sequence i's routing wherever the rank
  // receives it, for a RECOMPUTE step whose plan holds none (a cluster
  // step); null: step->replay.recompute_routing.
  std::shared_ptr<const std::vector<std::shared_ptr<const std::string>>> recompute_routing;
};

// What this process holds of a step for one rank (Trainer.FetchPieces): the
// rank's pieces are the rows of the sequences owned here.
struct RankPieces {
  RankStep rank;
  // Owner of each of the step's sequences, an index into `members`; empty
  // when every sequence is here (a single server, or a step this member
  // made before it joined a cluster).
  std::shared_ptr<const std::vector<int32_t>> owner;
  // Member ids (cluster addresses); empty outside a cluster.
  std::vector<std::string> members;
  // This member's index in `members` (-1: it owns none of the step).
  int self = -1;
};

class StepDirectory {
 public:
  virtual ~StepDirectory() = default;
  // SampleStore::CreateStep's contract.
  virtual absl::StatusOr<std::shared_ptr<const Step>> CreateStep(const StepRequest& request) = 0;
  // The step's plan and layout (its samples may be elsewhere). NOT_FOUND
  // naming the step when it is not live.
  virtual absl::StatusOr<std::shared_ptr<const Step>> GetStep(const std::string& step_id) = 0;
  // The step with every sample the rank at `coords` receives at hand.
  // INVALID_ARGUMENT for coordinates outside the step's topology.
  virtual absl::StatusOr<RankStep> GetStepForRank(const std::string& step_id,
                                                  const RankCoords& coords) = 0;
  // The step with this member's own samples the rank receives at hand
  // (set in `samples`, or in the step's own, for every such sequence), and
  // who owns the others. INVALID_ARGUMENT for coordinates outside the
  // step's topology.
  virtual absl::StatusOr<RankPieces> GetPiecesForRank(const std::string& step_id,
                                                      const RankCoords& coords) = 0;
  virtual absl::StatusOr<ReleaseResult> ReleaseStep(const std::string& step_id) = 0;
  // The live steps of `pool` ("" = every pool), by step id. NOT_FOUND for
  // a pool with no registered model.
  virtual absl::StatusOr<std::vector<LiveStep>> ListSteps(const std::string& pool) = 0;
  // When the live step was created (ns since the Unix epoch; 0 unknown).
  virtual int64_t CreatedUnixNanos(const std::string& step_id) = 0;
  // Cluster mode: the members holding the live step's samples
  // (StepInfo.holders); none for a step of this process alone.
  virtual std::vector<LiveStep::Holder> StepHolders(const std::string& step_id) { return {}; }
  // SampleStore::SetPolicyVersion, over every member of a cluster (this one
  // only with `local_only`); the pool as GetPool reports it afterwards.
  virtual absl::StatusOr<v1::PoolInfo> SetPolicyVersion(const std::string& pool,
                                                        int64_t policy_version,
                                                        bool local_only) = 0;
  // True when calls may wait on other processes (a cluster member's pulls):
  // callers keep them off threads those processes' answers need.
  virtual bool MayBlock() const = 0;
  // R2 (docs/layout.md section 11): a rank's recorded routing of one
  // micro-batch (RecomputeUploads::Upload), and the step's commit.
  virtual absl::StatusOr<RoutingUploadResult> UploadRouting(const std::string& step_id,
                                                            const RankCoords& coords,
                                                            int microbatch,
                                                            const UploadedRouting& upload) = 0;
  virtual absl::StatusOr<RoutingCommitResult> CommitRouting(const std::string& step_id) = 0;
};

// The single server's directory: the store's own steps.
class LocalSteps final : public StepDirectory {
 public:
  explicit LocalSteps(SampleStore* store) : store_(store), uploads_(store) {}

  absl::StatusOr<std::shared_ptr<const Step>> CreateStep(const StepRequest& request) override {
    return store_->CreateStep(request);
  }
  absl::StatusOr<std::shared_ptr<const Step>> GetStep(const std::string& step_id) override {
    return store_->GetStep(step_id);
  }
  absl::StatusOr<RankStep> GetStepForRank(const std::string& step_id,
                                          const RankCoords& coords) override {
    absl::StatusOr<std::shared_ptr<const Step>> step = store_->GetStep(step_id);
    if (!step.ok()) return step.status();
    if (absl::Status s = (*step)->layout.ValidateCoords(coords); !s.ok()) return s;
    return RankStep{*std::move(step), nullptr, nullptr};
  }
  absl::StatusOr<RankPieces> GetPiecesForRank(const std::string& step_id,
                                              const RankCoords& coords) override {
    absl::StatusOr<RankStep> rank = GetStepForRank(step_id, coords);
    if (!rank.ok()) return rank.status();
    return RankPieces{*std::move(rank), nullptr, {}, -1};
  }
  absl::StatusOr<ReleaseResult> ReleaseStep(const std::string& step_id) override {
    absl::StatusOr<ReleaseResult> released = store_->ReleaseStep(step_id);
    uploads_.DropStale();  // an R2 stage of the step gives its memory back
    return released;
  }
  absl::StatusOr<std::vector<LiveStep>> ListSteps(const std::string& pool) override {
    if (!pool.empty()) {
      if (absl::Status s = store_->GetModel(pool).status(); !s.ok()) return s;
    }
    return store_->ListSteps(pool);
  }
  int64_t CreatedUnixNanos(const std::string& step_id) override {
    return store_->StepCreatedUnixNanos(step_id);
  }
  absl::StatusOr<v1::PoolInfo> SetPolicyVersion(const std::string& pool, int64_t policy_version,
                                                bool local_only) override {
    absl::StatusOr<PoolStats> stats = store_->SetPolicyVersion(pool, policy_version);
    if (!stats.ok()) return stats.status();
    return PoolInfoToProto(*stats, store_->Stats(), /*group_shares=*/false);
  }
  bool MayBlock() const override { return false; }
  absl::StatusOr<RoutingUploadResult> UploadRouting(const std::string& step_id,
                                                    const RankCoords& coords, int microbatch,
                                                    const UploadedRouting& upload) override {
    return uploads_.Upload(step_id, coords, microbatch, upload);
  }
  absl::StatusOr<RoutingCommitResult> CommitRouting(const std::string& step_id) override {
    return uploads_.Commit(step_id);
  }

 private:
  SampleStore* const store_;
  RecomputeUploads uploads_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STEP_DIRECTORY_H_
