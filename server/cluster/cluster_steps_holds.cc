// Taking a cluster step's samples on their owners (cluster_steps.h, steps
// 1 and 2 of the protocol): every owner holds its share for the attempt, or
// every hold of the attempt is dropped; once the record is committed, the
// owners confirm theirs.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/incarnation.h"
#include "server/cluster/peer_calls.h"
#include "server/cluster/step_owners.h"
#include "spdlog/spdlog.h"

namespace rollpack {

absl::Status ClusterSteps::HoldAll(Cluster* cluster, const v1::ClusterStepRecord& record,
                                   HeldScalars* scalars, std::vector<std::string>* incarnations) {
  const int n = record.members_size();
  scalars->assign(n, std::nullopt);
  incarnations->assign(n, "");
  std::vector<std::vector<std::string>> ids(n);
  for (int i = 0; i < record.sample_ids_size(); ++i) {
    ids[record.owner(i)].push_back(record.sample_ids(i));
  }
  std::vector<absl::Status> results(n);
  ForEachOwner(
      cluster, record, options_.member_timeout,
      [&](int i) {
        results[i] = store_->Hold(record.step_id(), record.pool(), ids[i], record.coordinator(),
                                  record.created_unix_nanos(), record.reuse_samples(),
                                  record.replay_source() == v1::REPLAY_SOURCE_RECOMPUTE);
        if (results[i].ok()) results[i] = OwnHeldScalars(record.step_id(), ids[i], &(*scalars)[i]);
        (*incarnations)[i] = cluster->options().incarnation;
      },
      [&](int i, v1::Member::Stub* stub, grpc::ClientContext* context) {
        v1::HoldSamplesRequest request;
        request.set_step_id(record.step_id());
        request.set_pool(record.pool());
        for (const std::string& id : ids[i]) request.add_sample_ids(id);
        request.set_coordinator(record.coordinator());
        request.set_attempt(record.created_unix_nanos());
        request.set_reuse_samples(record.reuse_samples());
        request.set_replay_source(record.replay_source());
        planning_bytes_.fetch_add(static_cast<int64_t>(request.ByteSizeLong()));
        v1::HoldSamplesResponse response;
        results[i] = FromPeer(stub->HoldSamples(context, request, &response), record.members(i),
                              "HoldSamples");
        if (results[i].ok() && response.sends_scalars()) {
          results[i] = ScalarsOfHold(response, record.members(i), ids[i].size(), &(*scalars)[i]);
        }
        // An older member says none; one that says something else is not
        // believed (the step then cannot tell its restart from an absence).
        if (results[i].ok() && IsIncarnation(response.incarnation())) {
          (*incarnations)[i] = response.incarnation();
        } else if (results[i].ok() && !response.incarnation().empty()) {
          spdlog::warn("rollpackd: step \"{}\": member {} answered HoldSamples with an "
                       "incarnation that is not 32 hex digits; its loss would not be recognised",
                       record.step_id(), record.members(i));
        }
        // An older member would delete a reuse step's samples at release.
        if (results[i].ok() && record.reuse_samples() && !response.lifecycle()) {
          results[i] = absl::FailedPreconditionError(absl::StrCat(
              "member ", record.members(i), " runs a rollpackd without reuse steps; every member "
              "must run the same version (docs/cluster.md)"));
        }
      });
  for (size_t i = 0; i < results.size(); ++i) {
    if (absl::IsAlreadyExists(results[i])) {
      // The owner still holds samples for an earlier attempt at this id
      // that was never committed; it gives them back within its grace.
      return absl::AbortedError(absl::StrCat(
          "member ", record.members(i), " still holds samples for an earlier, uncommitted "
          "attempt at this step id; retry in ", absl::FormatDuration(options_.hold_grace),
          " or under another id"));
    }
    RETURN_IF_ERROR(results[i]);
  }
  return absl::OkStatus();
}

void ClusterSteps::DropAll(Cluster* cluster, const v1::ClusterStepRecord& record) {
  // Every owner asked, answered or not (a hold whose answer was lost is
  // still a hold); only this attempt's holds go. A drop that fails leaves
  // an unconfirmed hold, which its member settles against etcd after
  // hold_grace.
  ForEachOwner(
      cluster, record, options_.member_timeout,
      [&](int) { store_->DropHold(record.step_id(), record.created_unix_nanos()).IgnoreError(); },
      [&](int, v1::Member::Stub* stub, grpc::ClientContext* context) {
        v1::StepHoldRequest request;
        request.set_step_id(record.step_id());
        request.set_attempt(record.created_unix_nanos());
        v1::DropHoldResponse response;
        stub->DropHold(context, request, &response);
      });
}

void ClusterSteps::ConfirmAll(Cluster* cluster, const v1::ClusterStepRecord& record) {
  // Best effort: an owner not reached confirms by itself after hold_grace
  // (the record exists).
  ForEachOwner(
      cluster, record, options_.member_timeout,
      [&](int) { store_->ConfirmHold(record.step_id()).IgnoreError(); },
      [&](int, v1::Member::Stub* stub, grpc::ClientContext* context) {
        v1::StepHoldRequest request;
        request.set_step_id(record.step_id());
        v1::ConfirmHoldResponse response;
        stub->ConfirmHold(context, request, &response);
      });
}

}  // namespace rollpack
