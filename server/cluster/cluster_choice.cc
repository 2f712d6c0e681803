// ClusterSteps' selection of a step's samples over every member's listing,
// and the trainer's policy version reaching every member
// (../shared/spec/lifecycle.md: it holds cluster-wide).
#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/group_census.h"
#include "server/cluster/peer_calls.h"
#include "server/store/names.h"
#include "server/store/pool_info.h"

namespace rollpack {
namespace {

// Only a plain "oldest N, nothing stale" needs no more than each member's
// oldest N; anything else selects over every free sample's metadata.
bool NeedsEveryFreeSample(const SelectionRequest& selection) {
  return selection.num_samples == 0 || selection.whole_groups ||
         selection.order != SelectionOrder::kOldest ||
         (selection.policy_version > 0 && selection.max_staleness.has_value());
}

}  // namespace

absl::StatusOr<ClusterSteps::Choice> ClusterSteps::Choose(Cluster* cluster,
                                                          const std::vector<ClusterMember>& members,
                                                          const StepRequest& request,
                                                          const SelectionRequest& selection) {
  const std::string& step_id = request.step_id;
  const std::string& pool = request.pool;
  const std::vector<std::string>& sample_ids = request.sample_ids;
  // lifecycle.md section 6: with required scalars a member's oldest free
  // samples may lack them, so the selection reads every free sample.
  absl::StatusOr<PoolOptions> pool_options = store_->GetOptions(pool);
  const bool annotated = pool_options.ok() && !pool_options->required_scalars.empty();
  const bool every = sample_ids.empty() && (NeedsEveryFreeSample(selection) || annotated);
  // ListFreeSamples takes an int32 limit; past it, every free sample.
  const int limit = every || selection.num_samples > std::numeric_limits<int32_t>::max()
                        ? -1
                        : static_cast<int>(selection.num_samples);
  std::vector<absl::StatusOr<SampleStore::SampleListing>> listings(
      members.size(), absl::UnknownError("not asked"));
  std::vector<int64_t> bytes(members.size(), 0);
  // Members drained for maintenance (docs/cluster.md): their free samples
  // go first, so that they empty. Not a vector<bool>: written in parallel.
  std::vector<char> draining(members.size(), 0);
  ForEachParallel(members.size(), [&](size_t i) {
    if (members[i].id == cluster->self().id) {
      listings[i] = store_->ListSamples(pool, sample_ids, limit);
      draining[i] = cluster->self_drained();
      return;
    }
    v1::ListFreeSamplesRequest list;
    list.set_pool(pool);
    for (const std::string& id : sample_ids) list.add_sample_ids(id);
    list.set_limit(limit);
    list.set_all_with_metadata(every);
    v1::FreeSamples response;
    grpc::ClientContext context;
    SetDeadline(&context, options_.member_timeout);
    absl::Status s = FromPeer(
        cluster->MemberStub(members[i])->ListFreeSamples(&context, list, &response),
        members[i].id, "ListFreeSamples");
    if (!s.ok()) {
      listings[i] = s;
      return;
    }
    bytes[i] = static_cast<int64_t>(list.ByteSizeLong() + response.ByteSizeLong());
    draining[i] = response.draining();
    // An older member leaves out the groups and versions (and lists nothing
    // for "every free sample"): selecting without them would be wrong.
    if (!response.lifecycle()) {
      listings[i] = absl::FailedPreconditionError(absl::StrCat(
          "member ", members[i].id, " runs a rollpackd without the sample lifecycle; every "
          "member must run the same version (docs/cluster.md)"));
      return;
    }
    SampleStore::SampleListing listing;
    listing.sample_ids.assign(response.sample_ids().begin(), response.sample_ids().end());
    listing.num_tokens.assign(response.num_tokens().begin(), response.num_tokens().end());
    listing.arrival_unix_nanos.assign(response.arrival_unix_nanos().begin(),
                                      response.arrival_unix_nanos().end());
    listing.free.assign(response.free().begin(), response.free().end());
    listing.group_ids.assign(response.group_ids().begin(), response.group_ids().end());
    listing.group_sizes.assign(response.group_sizes().begin(), response.group_sizes().end());
    listing.policy_versions.assign(response.policy_versions().begin(),
                                   response.policy_versions().end());
    listing.open_sample_ids.assign(response.open_sample_ids().begin(),
                                   response.open_sample_ids().end());
    if (response.annotations()) {
      listing.missing_scalars.assign(response.missing_scalars().begin(),
                                     response.missing_scalars().end());
      listing.ready_unix_nanos.assign(response.ready_unix_nanos().begin(),
                                      response.ready_unix_nanos().end());
    } else if (annotated) {
      listings[i] = absl::FailedPreconditionError(absl::StrCat(
          "member ", members[i].id, " runs a rollpackd without annotations, and pool \"", pool,
          "\" requires scalars; every member must run the same version (docs/cluster.md)"));
      return;
    }
    listings[i] = std::move(listing);
  });
  for (int64_t b : bytes) planning_bytes_.fetch_add(b);

  Choice choice;
  for (const ClusterMember& m : members) choice.members.push_back(m.id);
  // Where each listed id is: (member, position in its listing).
  absl::flat_hash_map<std::string, std::pair<int, int>> where;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!listings[i].ok()) {
      // A member that never saw the pool holds none of its samples.
      if (absl::IsNotFound(listings[i].status())) {
        listings[i] = SampleStore::SampleListing{};
        continue;
      }
      return listings[i].status();
    }
    SampleStore::SampleListing& l = *listings[i];
    const size_t n = l.sample_ids.size();
    if (l.num_tokens.size() != n || l.free.size() != n || l.arrival_unix_nanos.size() != n) {
      return absl::InternalError(
          absl::StrCat("member ", members[i].id, " answered ListFreeSamples inconsistently"));
    }
    if (l.group_ids.size() != n || l.group_sizes.size() != n || l.policy_versions.size() != n) {
      return absl::InternalError(absl::StrCat("member ", members[i].id,
                                              " answered ListFreeSamples without sample metadata"));
    }
    if (annotated && (l.missing_scalars.size() != n || l.ready_unix_nanos.size() != n)) {
      return absl::InternalError(absl::StrCat("member ", members[i].id,
                                              " answered ListFreeSamples without annotations"));
    }
    for (size_t j = 0; j < n; ++j) {
      auto [it, inserted] =
          where.try_emplace(l.sample_ids[j], static_cast<int>(i), static_cast<int>(j));
      if (!inserted) {
        return absl::FailedPreconditionError(absl::StrCat(
            "sample \"", l.sample_ids[j], "\" of pool \"", pool, "\" is held by two members, ",
            members[it->second.first].id, " and ", members[i].id));
      }
    }
  }
  auto candidate = [&](int member, int position) {
    const SampleStore::SampleListing& l = *listings[member];
    SampleCandidate c;
    c.sample_id = l.sample_ids[position];
    c.num_tokens = l.num_tokens[position];
    c.policy_version = l.policy_versions[position];
    c.group_id = l.group_ids[position];
    c.group_size = l.group_sizes[position];
    if (annotated) {
      // Not selectable while it lacks one; a group it completed late sorts
      // by when it did (arrival times are the cluster's OLDEST clock).
      c.missing_scalar = l.missing_scalars[position];
      c.ready_key = l.ready_unix_nanos[position];
    }
    return c;
  };
  auto take = [&](int member, int position) {
    const SampleStore::SampleListing& l = *listings[member];
    choice.sample_ids.push_back(l.sample_ids[position]);
    choice.num_tokens.push_back(l.num_tokens[position]);
    choice.owner.push_back(member);
    choice.group_ids.push_back(l.group_ids[position]);
    choice.group_sizes.push_back(l.group_sizes[position]);
    choice.policy_versions.push_back(l.policy_versions[position]);
  };
  if (!sample_ids.empty()) {
    absl::flat_hash_set<std::string> seen;
    std::vector<SampleCandidate> chosen;
    for (const std::string& id : sample_ids) {
      if (!seen.insert(id).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("step \"", step_id, "\": sample \"", id, "\" is listed twice"));
      }
      auto it = where.find(id);
      if (it == where.end()) {
        for (size_t m = 0; m < listings.size(); ++m) {
          const std::vector<std::string>& open = listings[m]->open_sample_ids;
          if (std::find(open.begin(), open.end(), id) != open.end()) {
            return absl::FailedPreconditionError(absl::StrCat(
                "sample \"", id, "\" is open on member ", members[m].id,
                " (its last piece is not stored yet): it is selectable once a piece seals it"));
          }
        }
        return absl::NotFoundError(absl::StrCat("sample \"", id, "\" is not in pool \"", pool,
                                                "\" on any of the ", members.size(),
                                                " members"));
      }
      const auto [member, position] = it->second;
      if (!listings[member]->free[position]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "sample \"", id, "\" is already in a live step (on member ", members[member].id, ")"));
      }
      chosen.push_back(candidate(member, position));
      take(member, position);
    }
    ASSIGN_OR_RETURN(choice.num_groups,
                     CheckExplicitSelection(chosen, selection, absl::StrCat("step \"", step_id, "\"")));
    return choice;
  }
  // Drained members' samples first, then oldest first over every member;
  // ties (same nanosecond) by member id, then by each member's own order,
  // so the choice is deterministic.
  std::vector<std::tuple<bool, int64_t, int, int>> order;
  for (size_t i = 0; i < members.size(); ++i) {
    const SampleStore::SampleListing& l = *listings[i];
    for (size_t j = 0; j < l.sample_ids.size(); ++j) {
      if (l.free[j]) order.emplace_back(draining[i] == 0, l.arrival_unix_nanos[j], i, j);
    }
  }
  std::sort(order.begin(), order.end());
  std::vector<SampleCandidate> candidates;
  candidates.reserve(order.size());
  for (const auto& [undrained, nanos, member, position] : order) {
    candidates.push_back(candidate(member, position));
  }
  ASSIGN_OR_RETURN(
      Selection selected,
      SelectSamples(candidates, selection,
                    absl::StrCat("step \"", step_id, "\": pool \"", pool, "\" (", members.size(),
                                 " members)")));
  for (int32_t k : selected.chosen) take(std::get<2>(order[k]), std::get<3>(order[k]));
  choice.num_groups = selected.num_groups;
  return choice;
}

absl::StatusOr<v1::PoolInfo> ClusterSteps::SetPolicyVersion(const std::string& pool,
                                                            int64_t policy_version,
                                                            bool local_only) {
  auto local = [&]() -> absl::StatusOr<v1::PoolInfo> {
    ASSIGN_OR_RETURN(ModelSpec model, store_->GetOrAdoptModel(pool));
    (void)model;
    ASSIGN_OR_RETURN(PoolStats stats, store_->SetPolicyVersion(pool, policy_version));
    return PoolInfoToProto(stats, store_->Stats(), /*group_shares=*/true);
  };
  if (local_only) return local();
  // Refused here as on a single server, not as whichever member answers first.
  RETURN_IF_ERROR(ValidateName("pool name", pool, kMaxPoolNameBytes));
  if (policy_version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy_version is ", policy_version, ", must be >= 0"));
  }
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  ASSIGN_OR_RETURN(std::vector<ClusterMember> members, cluster->Members());
  std::vector<absl::StatusOr<v1::PoolInfo>> shares(members.size(),
                                                   absl::UnknownError("not asked"));
  ForEachParallel(members.size(), [&](size_t i) {
    shares[i] = members[i].id == cluster->self().id
                    ? local()
                    : cluster->SetPolicyVersionOf(members[i], pool, policy_version);
  });
  v1::PoolInfo total;
  total.set_pool(pool);
  std::vector<bool> hold_complete_groups(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    // Every member must have it: a member that missed it would select
    // samples the trainer no longer wants. A retry is harmless.
    if (!shares[i].ok() && !absl::IsNotFound(shares[i].status())) return shares[i].status();
    if (shares[i].ok() && !total.has_model()) *total.mutable_model() = shares[i]->model();
    AddPoolShare(members[i].id, shares[i], &total);
    hold_complete_groups[i] = shares[i].ok() && shares[i]->num_complete_groups() > 0;
  }
  // The version is set everywhere by now: counts a member leaves unsaid
  // here do not fail the call (GetPool counts them again).
  absl::StatusOr<absl::flat_hash_map<std::string, int>> complete_holders =
      CountCompleteHolders(*cluster, *store_, members, hold_complete_groups, pool,
                           GroupsToCheckForComplete(total));
  FinishPoolShares(&total, complete_holders.ok() ? *complete_holders
                                                 : absl::flat_hash_map<std::string, int>{});
  return total;
}

}  // namespace rollpack
