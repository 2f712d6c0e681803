#include "server/ingest/rollouts_service.h"

#include <algorithm>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "scheduler/model_spec.h"
#include "server/cluster/cluster_annotations.h"
#include "server/cluster/group_census.h"
#include "server/cluster/peer_calls.h"
#include "server/ops/call_log.h"
#include "server/store/convert.h"
#include "server/store/names.h"
#include "server/store/pool_info.h"

namespace rollpack {
namespace {

// A PutSamples refused before reading anything (authentication).
class RefusedPut final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedPut(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

RolloutsService::RolloutsService(SampleStore* store, ServerMetrics* metrics,
                                 const Authorizer* auth, IngestOptions ingest, bool cluster_mode)
    : store_(store), metrics_(metrics), cluster_mode_(cluster_mode), auth_(auth), ingest_(ingest) {
  if (ingest_.messages_in_flight > 1) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    workers_ = std::make_unique<WorkerPool>(
        ingest_.threads > 0 ? ingest_.threads : std::clamp(cores, 1, 8));
  }
}

grpc::ServerUnaryReactor* RolloutsService::RegisterModel(grpc::CallbackServerContext* context,
                                                         const v1::RegisterModelRequest* request,
                                                         v1::RegisterModelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/RegisterModel"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  std::optional<PoolOptions> options;
  if (request->has_options()) {
    absl::StatusOr<PoolOptions> parsed = FromProto(request->options());
    if (!parsed.ok()) {
      reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("pool \"", request->pool(), "\": ", parsed.status().message()))));
      return reactor;
    }
    options = *parsed;
  }
  absl::StatusOr<bool> created = Register(request->pool(), FromProto(request->model()), options);
  if (created.ok()) {
    response->set_created(*created);
    *response->mutable_model() = request->model();
    absl::StatusOr<PoolOptions> held = store_->GetOptions(request->pool());
    if (held.ok()) *response->mutable_options() = ToProto(*held);
  }
  reactor->Finish(ToGrpcStatus(created.status()));
  return reactor;
}

absl::StatusOr<bool> RolloutsService::Register(const std::string& pool,
                                                   const ModelSpec& model,
                                                   const std::optional<PoolOptions>& options) {
  Cluster* const cluster = cluster_.load();
  if (!cluster_mode_) return store_->RegisterModel(pool, model, options);
  if (cluster == nullptr) return absl::UnavailableError("this member is still joining its cluster");
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

grpc::ServerReadReactor<grpc::ByteBuffer>* RolloutsService::PutSamples(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/PutSamples"); !s.ok()) {
      return new RefusedPut(s);
    }
  }
  // Refused at once when drained; a stream open before the drain is
  // refused at its next message.
  if (absl::Status accepts = AcceptsNewSamples(); !accepts.ok()) {
    return new RefusedPut(ToGrpcStatus(accepts));
  }
  std::shared_ptr<CommitSequencer> sequencer;
  int stripe = 0;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find(StripedCalls::kMetadataKey); it != metadata.end()) {
    absl::StatusOr<std::shared_ptr<CommitSequencer>> joined =
        striped_calls_.Join(absl::string_view(it->second.data(), it->second.size()), &stripe);
    if (!joined.ok()) return new RefusedPut(ToGrpcStatus(joined.status()));
    sequencer = *std::move(joined);
  } else {
    sequencer = CommitSequencer::Create();
  }
  return NewPutSamplesReactor(store_, metrics_, workers_.get(), ingest_, std::move(sequencer),
                              stripe, response, [this] { return AcceptsNewSamples(); });
}

absl::Status RolloutsService::AcceptsNewSamples() const {
  if (!cluster_mode_) return absl::OkStatus();
  // Until the join has read this member's drain key, it may be drained.
  Cluster* const cluster = cluster_.load();
  if (cluster == nullptr) return absl::UnavailableError("this member is still joining its cluster");
  return cluster->AcceptsNewSamples();
}

grpc::ServerUnaryReactor* RolloutsService::GetPool(grpc::CallbackServerContext* context,
                                                   const v1::GetPoolRequest* request,
                                                   v1::PoolInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/GetPool"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  if (cluster_mode_ && !request->local_only()) {
    reactor->Finish(ToGrpcStatus(ClusterPool(request->pool(), response)));
    return reactor;
  }
  absl::StatusOr<v1::PoolInfo> local = LocalPool(request->pool());
  if (local.ok() && request->local_only() && request->complete_group_ids_size() > 0) {
    // A peer summing the cluster's pool asks which of its listed groups
    // are complete here (group_census.h).
    absl::StatusOr<std::vector<GroupShareStats>> complete = store_->CompleteGroups(
        request->pool(), {request->complete_group_ids().begin(), request->complete_group_ids().end()});
    if (complete.ok()) {
      AddCompleteGroupShares(*complete, &*local);
    } else {
      local = complete.status();
    }
  }
  if (local.ok()) *response = *std::move(local);
  reactor->Finish(ToGrpcStatus(local.status()));
  return reactor;
}

grpc::ServerUnaryReactor* RolloutsService::ListPools(grpc::CallbackServerContext* context,
                                                     const v1::ListPoolsRequest* /*request*/,
                                                     v1::ListPoolsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/ListPools"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  reactor->Finish(ToGrpcStatus([&]() -> absl::Status {
    std::vector<std::string> names;
    if (cluster_mode_) {
      Cluster* const cluster = cluster_.load();
      if (cluster == nullptr) return absl::UnavailableError("this member is still joining its cluster");
      ASSIGN_OR_RETURN(names, cluster->PoolNames());
    } else {
      names = store_->PoolNames();
    }
    for (const std::string& name : names) {
      v1::PoolInfo info;
      absl::Status s = absl::OkStatus();
      if (cluster_mode_) {
        s = ClusterPool(name, &info);
      } else {
        absl::StatusOr<v1::PoolInfo> local = LocalPool(name);
        s = local.status();
        if (local.ok()) info = *std::move(local);
      }
      if (absl::IsNotFound(s)) continue;
      RETURN_IF_ERROR(s);
      *response->add_pools() = std::move(info);
    }
    return absl::OkStatus();
  }()));
  return reactor;
}

absl::StatusOr<int32_t> RolloutsService::Annotate(const v1::AnnotateSamplesRequest& request) {
  std::vector<ScalarAnnotation> annotations;
  annotations.reserve(request.annotations_size());
  for (const v1::SampleAnnotation& a : request.annotations()) {
    annotations.push_back(ScalarAnnotation{
        a.sample_id(), std::map<std::string, double>(a.scalars().begin(), a.scalars().end())});
  }
  if (!cluster_mode_) return store_->AnnotateSamples(request.pool(), annotations);
  // Any member takes it for samples on any member (cluster_annotations.h).
  Cluster* const cluster = cluster_.load();
  if (cluster == nullptr) return absl::UnavailableError("this member is still joining its cluster");
  return AnnotateOverCluster(cluster, store_, request.pool(), std::move(annotations));
}

grpc::ServerUnaryReactor* RolloutsService::AnnotateSamples(
    grpc::CallbackServerContext* context, const v1::AnnotateSamplesRequest* request,
    v1::AnnotateSamplesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/AnnotateSamples");
        !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  absl::StatusOr<int32_t> annotated = Annotate(*request);
  if (annotated.ok()) {
    response->set_annotated(*annotated);
    AnnotateCall(context, absl::StrCat("pool \"", request->pool(), "\": ", *annotated,
                                       " samples annotated"));
  }
  reactor->Finish(ToGrpcStatus(annotated.status()));
  return reactor;
}

absl::StatusOr<v1::PoolInfo> RolloutsService::LocalPool(const std::string& pool) const {
  ASSIGN_OR_RETURN(PoolStats stats, store_->GetPool(pool));
  // A member's answer carries its incomplete groups for the one summing.
  return PoolInfoToProto(stats, store_->Stats(), /*group_shares=*/cluster_mode_);
}

absl::Status RolloutsService::ClusterPool(const std::string& pool, v1::PoolInfo* response) {
  RETURN_IF_ERROR(ValidateName("pool name", pool, kMaxPoolNameBytes));
  Cluster* const cluster = cluster_.load();
  if (cluster == nullptr) return absl::UnavailableError("this member is still joining its cluster");
  ASSIGN_OR_RETURN(std::optional<ModelSpec> model, cluster->LookupPool(pool));
  if (!model.has_value()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool, "\" has no registered model in cluster \"",
                                            cluster->options().name, "\""));
  }
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
    response->set_stale_membership(absl::StrCat(
        "etcd (", cluster->etcd()->endpoints(), ") unreachable for ",
        absl::FormatDuration(absl::Trunc(away, absl::Milliseconds(100))),
        ": the members this member listed while etcd was well, and the model it knew"));
  }
  response->set_pool(pool);
  *response->mutable_model() = ToProto(*model);
  std::vector<absl::StatusOr<v1::PoolInfo>> shares(members.size(),
                                                   absl::UnknownError("not asked"));
  ForEachParallel(members.size(), [&](size_t i) {
    shares[i] = members[i].id == cluster->self().id ? LocalPool(pool)
                                                    : cluster->GetPoolOf(members[i], pool);
  });
  std::vector<bool> hold_complete_groups(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    AddPoolShare(members[i].id, shares[i], response);
    hold_complete_groups[i] = shares[i].ok() && shares[i]->num_complete_groups() > 0;
  }
  // A member that does not answer this second round leaves its complete
  // groups uncounted against the others' lists, as the first round's
  // counts stand: the view of one moment, not a decision.
  absl::StatusOr<absl::flat_hash_map<std::string, int>> complete_holders =
      CountCompleteHolders(*cluster, *store_, members, hold_complete_groups, pool,
                           GroupsToCheckForComplete(*response));
  FinishPoolShares(response, complete_holders.ok() ? *complete_holders
                                                   : absl::flat_hash_map<std::string, int>{});
  // A step over k members is held on each: the cluster has it once.
  if (live_steps_of_pool_) {
    absl::StatusOr<int64_t> live_steps = live_steps_of_pool_(pool);
    if (live_steps.ok()) response->set_num_live_steps(*live_steps);
  }
  return absl::OkStatus();
}

}  // namespace rollpack
