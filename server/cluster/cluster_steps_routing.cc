// ClusterSteps' side of R2 (docs/recompute.md, "In a cluster"): a rank
// uploads to any member, which splits the rows by owner and stages each
// share on the member that holds those samples; a commit is two phases
// over the owners, so a gap anywhere stores nothing anywhere.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "grpcpp/client_context.h"
#include "rollpack/v1/member.grpc.pb.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/peer_calls.h"
#include "server/cluster/step_owners.h"
#include "server/store/convert.h"
#include "server/store/recompute_routing.h"

namespace rollpack {
namespace {

// The dtype an upload was sent as (its view in UploadedRouting).
v1::DType UploadDType(const UploadedRouting& upload) {
  switch (upload.element_bytes) {
    case 1:
      return v1::UINT8;
    case 2:
      return upload.is_signed ? v1::INT16 : v1::UINT16;
    case 4:
      return v1::INT32;
    default:
      return v1::INT64;
  }
}

RoutingCommitResult CommitResultFrom(const v1::CommitRoutingResponse& response) {
  RoutingCommitResult result;
  result.samples = response.samples();
  result.tokens = response.tokens();
  result.stored_bytes = response.stored_bytes();
  return result;
}

absl::Status DenseStep(const Step& step) {
  return absl::FailedPreconditionError(absl::StrCat(
      "step \"", step.step_id, "\": pool \"", step.pool,
      "\" holds a dense model (num_experts 0): there is no routing to record"));
}

}  // namespace

void ClusterSteps::DropStaleRoutingStages() { uploads_.DropStale(); }

absl::StatusOr<HeldStep> ClusterSteps::HeldShare(const std::string& step_id, int64_t attempt) {
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  // The plan of the record as etcd holds it now (one keys-only read while
  // it is unchanged): this member's hold of the attempt proves the step
  // live, not that its record is still the bytes a cached plan was made of.
  ASSIGN_OR_RETURN(std::shared_ptr<CachedStep> cached, Find(step_id));
  if (cached->record.created_unix_nanos() != attempt) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step \"", step_id, "\" was released and created again meanwhile (another attempt)"));
  }
  HeldStep held;
  held.step = cached->step;
  held.owner = cached->owner;
  held.attempt = attempt;
  for (int i = 0; i < cached->record.members_size(); ++i) {
    if (cached->record.members(i) == cluster->self().id) held.self = i;
  }
  if (held.self < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("step \"", step_id, "\" holds no samples on member ", cluster->self().id));
  }
  return held;
}

absl::StatusOr<RoutingUploadResult> ClusterSteps::StageHeldRouting(
    const v1::StageRoutingRequest& request) {
  const v1::RecordedRouting& routing = request.routing();
  ASSIGN_OR_RETURN(HeldStep held, HeldShare(routing.step_id(), request.attempt()));
  ASSIGN_OR_RETURN(UploadedRouting share, ViewRecordedRouting(routing));
  share.rows = request.uploaded_rows();  // the rank's router rows; data: this share's
  const RankCoords coords{routing.rank().dp(), routing.rank().cp(), routing.rank().tp(),
                          routing.rank().pp()};
  return uploads_.UploadHeld(held, coords, routing.index(), share);
}

absl::StatusOr<RoutingCommitResult> ClusterSteps::CheckHeldRouting(const std::string& step_id,
                                                                   int64_t attempt) {
  ASSIGN_OR_RETURN(HeldStep held, HeldShare(step_id, attempt));
  return uploads_.CheckHeld(held);
}

absl::StatusOr<RoutingCommitResult> ClusterSteps::CommitHeldRouting(const std::string& step_id,
                                                                    int64_t attempt) {
  ASSIGN_OR_RETURN(HeldStep held, HeldShare(step_id, attempt));
  return uploads_.CommitHeld(held);
}

absl::StatusOr<RoutingUploadResult> ClusterSteps::UploadRouting(const std::string& step_id,
                                                                const RankCoords& coords,
                                                                int microbatch,
                                                                const UploadedRouting& upload) {
  // A step made here before this member joined a cluster.
  if (store_->GetStep(step_id).ok()) {
    return uploads_.Upload(step_id, coords, microbatch, upload);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<CachedStep> cached, Find(step_id));
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  const Step& step = *cached->step;
  if (step.model.is_dense()) return DenseStep(step);
  ASSIGN_OR_RETURN(RankMicrobatchLayout rank, step.layout.Describe(coords, microbatch));
  RETURN_IF_ERROR(CheckUploadShape(rank, step.model.topk, upload));
  // Everything an owner could refuse without its stage is refused here,
  // before any owner stages a row (layout.md section 11: a malformed
  // upload changes nothing).
  RETURN_IF_ERROR(RecomputeRoutingStage::CheckIds(step, rank, upload));
  const int num_owners = cached->record.members_size();
  std::vector<std::string> shares;
  SplitUploadByOwner(rank, upload, *cached->owner, num_owners, &shares);
  const int64_t row_bytes = upload.layers * upload.topk * upload.element_bytes;
  const int64_t attempt = cached->record.created_unix_nanos();

  std::vector<absl::StatusOr<RoutingUploadResult>> results(num_owners, RoutingUploadResult{});
  // A thread per owner this upload reaches (a micro-batch's samples sit on
  // few members), none for the others.
  std::vector<int> reached;
  for (int o = 0; o < num_owners; ++o) {
    if (!shares[o].empty()) reached.push_back(o);
  }
  ForEachParallel(reached.size(), [&](size_t r) {
    const int o = reached[r];
    const std::string& member = cached->record.members(o);
    v1::StageRoutingRequest request;
    v1::RecordedRouting* routing = request.mutable_routing();
    routing->set_step_id(step_id);
    routing->mutable_rank()->set_dp(coords.dp);
    routing->mutable_rank()->set_cp(coords.cp);
    routing->mutable_rank()->set_tp(coords.tp);
    routing->mutable_rank()->set_pp(coords.pp);
    routing->set_index(microbatch);
    v1::NDArray* experts = routing->mutable_experts();
    experts->set_dtype(UploadDType(upload));
    experts->add_shape(static_cast<int64_t>(shares[o].size()) / row_bytes);
    experts->add_shape(upload.layers);
    experts->add_shape(upload.topk);
    *experts->mutable_data() = std::move(shares[o]);
    request.set_attempt(attempt);
    request.set_uploaded_rows(upload.rows);
    if (member == cluster->self().id) {
      results[o] = StageHeldRouting(request);
      return;
    }
    v1::UploadRoutingResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, options_.member_timeout);
    absl::Status s =
        FromPeer(cluster->MemberStub({member, member})->StageRouting(&context, request, &response),
                 member, "StageRouting");
    if (!s.ok()) {
      results[o] = s;
      return;
    }
    RoutingUploadResult result;
    result.rows = response.rows();
    result.repeated_rows = response.repeated_rows();
    result.missing_entries = response.missing_entries();
    results[o] = result;
  });
  RoutingUploadResult total;
  for (const auto& r : results) {
    RETURN_IF_ERROR(r.status());
    total.rows += r->rows;
    total.repeated_rows += r->repeated_rows;
    total.missing_entries += r->missing_entries;
  }
  return total;
}

absl::StatusOr<RoutingCommitResult> ClusterSteps::CommitPhase(
    Cluster* cluster, const CachedStep& cached, bool commit,
    std::vector<std::string>* committed_on) {
  const v1::ClusterStepRecord& record = cached.record;
  std::vector<char> owns(record.members_size(), 0);
  for (int32_t o : record.owner()) owns[o] = 1;
  std::vector<absl::StatusOr<RoutingCommitResult>> results(owns.size(), RoutingCommitResult{});
  ForEachOwner(
      cluster, record, options_.member_timeout,
      [&](int o) {
        results[o] = commit ? CommitHeldRouting(record.step_id(), record.created_unix_nanos())
                            : CheckHeldRouting(record.step_id(), record.created_unix_nanos());
      },
      [&](int o, v1::Member::Stub* stub, grpc::ClientContext* context) {
        v1::MemberRoutingRequest request;
        request.set_step_id(record.step_id());
        request.set_attempt(record.created_unix_nanos());
        v1::CommitRoutingResponse response;
        const grpc::Status status = commit ? stub->CommitRouting(context, request, &response)
                                           : stub->CheckRouting(context, request, &response);
        absl::Status s =
            FromPeer(status, record.members(o), commit ? "CommitRouting" : "CheckRouting");
        if (s.ok()) {
          results[o] = CommitResultFrom(response);
        } else {
          results[o] = s;
        }
      });
  RoutingCommitResult total;
  absl::Status first;
  for (size_t o = 0; o < results.size(); ++o) {
    if (!results[o].ok()) {
      if (first.ok()) first = results[o].status();
      continue;
    }
    if (owns[o] && committed_on != nullptr) committed_on->push_back(record.members(o));
    total.samples += results[o]->samples;
    total.tokens += results[o]->tokens;
    total.stored_bytes += results[o]->stored_bytes;
  }
  RETURN_IF_ERROR(first);
  return total;
}

absl::StatusOr<RoutingCommitResult> ClusterSteps::CommitRouting(const std::string& step_id) {
  if (store_->GetStep(step_id).ok()) return uploads_.Commit(step_id);
  ASSIGN_OR_RETURN(std::shared_ptr<CachedStep> cached, Find(step_id));
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  if (cached->step->model.is_dense()) return DenseStep(*cached->step);
  // Phase 1 changes nothing: every owner's share is complete, or the first
  // gap is the answer and nothing is stored anywhere.
  RETURN_IF_ERROR(CommitPhase(cluster, *cached, /*commit=*/false, nullptr).status());
  // Phase 2: each owner stores its samples' routing (durably, at once). An
  // owner that fails now leaves the others committed; a retry completes the
  // commit (the committed ones answer as before).
  std::vector<std::string> committed_on;
  absl::StatusOr<RoutingCommitResult> result =
      CommitPhase(cluster, *cached, /*commit=*/true, &committed_on);
  if (!result.ok()) {
    return absl::Status(
        result.status().code(),
        absl::StrCat(result.status().message(), " (committed on ",
                     committed_on.empty() ? "no member" : absl::StrJoin(committed_on, ", "),
                     "; retry CommitRouting to complete it: docs/cluster.md)"));
  }
  return result;
}

}  // namespace rollpack
