#include "server/cluster/cluster_pool_directory.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "scheduler/model_spec.h"
#include "server/cluster/cluster_annotations.h"
#include "server/cluster/group_census.h"
#include "server/cluster/peer_calls.h"
#include "server/store/convert.h"
#include "server/store/names.h"
#include "server/store/pool_info.h"
#include "server/store/sample_pages.h"

namespace rollpack {
namespace {

// The services' calls before the join (retryable).
constexpr char kJoining[] = "this member is still joining its cluster";
// The store's, for a pool or schema it looks up.
constexpr char kNotInCluster[] = "this member is not in its cluster";

}  // namespace

absl::StatusOr<Cluster*> ClusterPoolDirectory::Joined(const char* why) const {
  Cluster* const cluster = cluster_.load();
  if (cluster == nullptr) return absl::UnavailableError(why);
  return cluster;
}

absl::StatusOr<bool> ClusterPoolDirectory::Register(const std::string& pool,
                                                    const ModelSpec& model,
                                                    const std::optional<PoolOptions>& options) {
  ASSIGN_OR_RETURN(Cluster* const cluster, Joined(kJoining));
  // Checked before anything is fixed for the whole cluster.
  RETURN_IF_ERROR(ValidateName("pool name", pool, kMaxPoolNameBytes));
  RETURN_IF_ERROR(ValidateModelSpec(model));
  // A pool this member would refuse is not fixed for the whole cluster.
  RETURN_IF_ERROR(store_->CheckPoolRoom(pool));
  // Options before the model: a member that adopts the pool once its model
  // is in etcd finds its options there too.
  ASSIGN_OR_RETURN(PoolOptions held_options,
                   cluster->FixPoolOptions(pool, options.value_or(PoolOptions{})));
  bool created = false;
  ASSIGN_OR_RETURN(ModelSpec held, cluster->RegisterPool(pool, model, &created));
  if (!(held == model)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool \"", pool, "\" already holds model \"", held.name,
        "\" with another spec in cluster \"", cluster->options().name,
        "\"; a pool holds one model"));
  }
  // The first registration fixed the options for the whole cluster.
  if (options.has_value() && held_options != *options) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool \"", pool, "\" was registered with other options (",
        ToProto(held_options).ShortDebugString(), ") in cluster \"", cluster->options().name,
        "\"; a pool's options are fixed"));
  }
  RETURN_IF_ERROR(store_->RegisterModel(pool, model, held_options));
  return created;
}

absl::StatusOr<std::optional<PoolDefinition>> ClusterPoolDirectory::Resolve(
    const std::string& pool) {
  ASSIGN_OR_RETURN(Cluster* const cluster, Joined(kNotInCluster));
  ASSIGN_OR_RETURN(std::optional<ModelSpec> model, cluster->LookupPool(pool));
  if (!model.has_value()) return std::optional<PoolDefinition>();
  ASSIGN_OR_RETURN(PoolOptions options, cluster->LookupPoolOptions(pool));
  return std::optional<PoolDefinition>(PoolDefinition{*std::move(model), options});
}

absl::StatusOr<std::map<std::string, FieldSchema>> ClusterPoolDirectory::FixSchema(
    const std::string& pool, const std::map<std::string, FieldSchema>& proposed) {
  ASSIGN_OR_RETURN(Cluster* const cluster, Joined(kNotInCluster));
  return cluster->FixSchema(pool, proposed);
}

absl::Status ClusterPoolDirectory::AcceptsNewSamples() const {
  ASSIGN_OR_RETURN(Cluster* const cluster, Joined(kJoining));
  return cluster->AcceptsNewSamples();
}

absl::StatusOr<v1::PoolInfo> ClusterPoolDirectory::GetPoolHere(const std::string& pool) const {
  ASSIGN_OR_RETURN(PoolStats stats, store_->GetPool(pool));
  // A member's answer carries its incomplete groups for the one summing.
  return PoolInfoToProto(stats, store_->Stats(), /*group_shares=*/true);
}

absl::StatusOr<v1::PoolInfo> ClusterPoolDirectory::GetPool(const std::string& pool) {
  RETURN_IF_ERROR(ValidateName("pool name", pool, kMaxPoolNameBytes));
  ASSIGN_OR_RETURN(Cluster* const cluster, Joined(kJoining));
  ASSIGN_OR_RETURN(std::optional<ModelSpec> model, cluster->LookupPool(pool));
  if (!model.has_value()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool,
                                            "\" has no registered model in cluster \"",
                                            cluster->options().name, "\""));
  }
  v1::PoolInfo response;
  // While etcd is unreachable the pool's model is the one this member knew
  // (LookupPool) and the members those it listed while etcd was well
  // (Cluster::LastMembers), said so in
  // stale_membership: an answer within the etcd client's budget at most,
  // never a wait for etcd.
  std::vector<ClusterMember> members;
  // A quick look first: right after etcd returned, before another call has
  // seen it, the member list is etcd's (Members waits for the members
  // rejoining), not this member's view from before.
  bool stale = !cluster->etcd_reachable() &&
               !cluster->etcd()->Probe(absl::Milliseconds(200));
  if (!stale) {
    // Its options and schema too, so that this member knows them while
    // etcd is away (a producer that read the model here then puts here).
    // Best effort: the answer does not need them.
    cluster->LookupPoolOptions(pool).IgnoreError();
    cluster->LearnSchema(pool).IgnoreError();
    absl::StatusOr<std::vector<ClusterMember>> listed = cluster->Members();
    if (listed.ok()) {
      members = *std::move(listed);
    } else if (absl::IsUnavailable(listed.status()) && !cluster->etcd_reachable()) {
      stale = true;
    } else {
      return listed.status();
    }
  }
  if (stale) {
    members = cluster->LastMembers();
    const absl::Duration away = cluster->etcd_reachability().UnreachableFor(absl::Now());
    response.set_stale_membership(absl::StrCat(
        "etcd (", cluster->etcd()->endpoints(), ") unreachable for ",
        absl::FormatDuration(absl::Trunc(away, absl::Milliseconds(100))),
        ": the members this member listed while etcd was well, and the model it knew"));
  }
  response.set_pool(pool);
  *response.mutable_model() = ToProto(*model);
  std::vector<absl::StatusOr<v1::PoolInfo>> shares(members.size(),
                                                   absl::UnknownError("not asked"));
  ForEachParallel(members.size(), [&](size_t i) {
    shares[i] = members[i].id == cluster->self().id ? GetPoolHere(pool)
                                                    : cluster->GetPoolOf(members[i], pool);
  });
  std::vector<bool> hold_complete_groups(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    AddPoolShare(members[i].id, shares[i], &response);
    hold_complete_groups[i] = shares[i].ok() && shares[i]->num_complete_groups() > 0;
  }
  // A member that does not answer this second round leaves its complete
  // groups uncounted against the others' lists, as the first round's
  // counts stand: the view of one moment, not a decision.
  absl::StatusOr<absl::flat_hash_map<std::string, int>> complete_holders =
      CountCompleteHolders(*cluster, *store_, members, hold_complete_groups, pool,
                           GroupsToCheckForComplete(response));
  FinishPoolShares(&response, complete_holders.ok() ? *complete_holders
                                                    : absl::flat_hash_map<std::string, int>{});
  // A step over k members is held on each: the cluster has it once.
  if (live_steps_of_pool_) {
    absl::StatusOr<int64_t> live_steps = live_steps_of_pool_(pool);
    if (live_steps.ok()) response.set_num_live_steps(*live_steps);
  }
  return response;
}

absl::StatusOr<std::vector<std::string>> ClusterPoolDirectory::PoolNames() {
  ASSIGN_OR_RETURN(Cluster* const cluster, Joined(kJoining));
  return cluster->PoolNames();
}

absl::StatusOr<int32_t> ClusterPoolDirectory::Annotate(const std::string& pool,
                                                       std::vector<ScalarAnnotation> annotations) {
  ASSIGN_OR_RETURN(Cluster* const cluster, Joined(kJoining));
  return AnnotateOverCluster(cluster, store_, pool, std::move(annotations));
}

absl::StatusOr<v1::DeletePoolResponse> ClusterPoolDirectory::DeletePool(
    const v1::DeletePoolRequest& request) {
  Cluster* const cluster = cluster_.load();
  if (cluster == nullptr || steps_ == nullptr) return absl::UnavailableError(kJoining);
  if (!request.local_only()) {
    absl::StatusOr<v1::DeletePoolResponse> deleted =
        DeletePoolOverCluster(cluster, steps_, store_, request, options_);
    // What this member remembers of the pool's etcd facts (answered while
    // etcd is away) goes with them.
    if (deleted.ok() && !request.dry_run()) cluster->ForgetPool(request.pool());
    return deleted;
  }
  ASSIGN_OR_RETURN(v1::MemberPoolDeletion share, DeleteLocalPool(store_, request));
  if (!request.dry_run()) cluster->ForgetPool(request.pool());
  share.set_member(cluster->self().id);
  v1::DeletePoolResponse response;
  response.set_pool(request.pool());
  response.set_dry_run(request.dry_run());
  response.set_deleted_samples(share.deleted_samples());
  response.set_deleted_bytes(share.deleted_bytes());
  *response.add_members() = std::move(share);
  return response;
}

absl::StatusOr<v1::ListSamplesResponse> ClusterPoolDirectory::ListSamples(
    const v1::ListSamplesRequest& request) {
  ASSIGN_OR_RETURN(Cluster* const cluster, Joined(kJoining));
  if (request.local_only()) return ListLocalSamples(store_, request, cluster->self().id);
  return ListSamplesOverCluster(cluster, store_, request, options_);
}

}  // namespace rollpack
