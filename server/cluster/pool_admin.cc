#include "server/cluster/pool_admin.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "server/cluster/peer_calls.h"
#include "server/store/names.h"
#include "server/store/sample_pages.h"

namespace rollpack {
namespace {

// Every member's share of one phase of a deletion, in member order.
std::vector<absl::StatusOr<v1::MemberPoolDeletion>> AskEveryMember(
    Cluster* cluster, SampleStore* store, const std::vector<ClusterMember>& members,
    v1::DeletePoolRequest request, const ClusterPoolsOptions& options) {
  request.set_local_only(true);
  std::vector<absl::StatusOr<v1::MemberPoolDeletion>> shares(members.size());
  ForEachParallel(members.size(), [&](size_t m) {
    if (members[m].id == cluster->self().id) {
      shares[m] = DeleteLocalPool(store, request);
    } else {
      v1::DeletePoolResponse response;
      grpc::ClientContext context;
      SetDeadline(&context, options.member_timeout);
      absl::Status s = FromPeer(
          cluster->RolloutsStub(members[m])->DeletePool(&context, request, &response),
          members[m].id, "DeletePool");
      if (!s.ok()) {
        shares[m] = s;
        return;
      }
      v1::MemberPoolDeletion share;
      share.set_deleted_samples(response.deleted_samples());
      share.set_deleted_bytes(response.deleted_bytes());
      share.set_absent(response.members_size() == 1 && response.members(0).absent());
      shares[m] = std::move(share);
    }
    if (shares[m].ok()) shares[m]->set_member(members[m].id);
  });
  return shares;
}

std::string NameAll(const std::vector<std::string>& ids, absl::string_view none) {
  return ids.empty() ? std::string(none) : absl::StrJoin(ids, ", ");
}

}  // namespace

absl::StatusOr<v1::MemberPoolDeletion> DeleteLocalPool(SampleStore* store,
                                                       const v1::DeletePoolRequest& request) {
  v1::MemberPoolDeletion share;
  absl::StatusOr<SampleStore::PoolDeletion> deleted =
      store->DeletePool(request.pool(), request.force(), request.dry_run());
  if (absl::IsNotFound(deleted.status())) {
    // Nothing of the pool here: a member that never took a sample of it.
    share.set_absent(true);
    return share;
  }
  RETURN_IF_ERROR(deleted.status());
  share.set_deleted_samples(deleted->samples);
  share.set_deleted_bytes(deleted->bytes);
  return share;
}

absl::StatusOr<v1::DeletePoolResponse> DeletePoolOverCluster(
    Cluster* cluster, StepDirectory* steps, SampleStore* store,
    const v1::DeletePoolRequest& request, const ClusterPoolsOptions& options) {
  const std::string& pool = request.pool();
  RETURN_IF_ERROR(ValidateName("pool name", pool, kMaxPoolNameBytes));
  ASSIGN_OR_RETURN(std::optional<ModelSpec> model, cluster->LookupPool(pool));
  std::vector<std::string> live;
  if (model.has_value()) {
    absl::StatusOr<std::vector<LiveStep>> listed = steps->ListSteps(pool);
    if (!listed.ok() && !absl::IsNotFound(listed.status())) return listed.status();
    if (listed.ok()) {
      for (const LiveStep& step : *listed) live.push_back(step.step->step_id);
    }
  }
  if (!live.empty() && !request.force()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool \"", pool, "\" has samples in live steps ", absl::StrJoin(live, ", "),
        " of cluster \"", cluster->options().name,
        "\": release them first, or delete with force (which releases them)"));
  }
  ASSIGN_OR_RETURN(std::vector<ClusterMember> members, cluster->Members());
  v1::DeletePoolResponse response;
  response.set_pool(pool);
  response.set_dry_run(request.dry_run());

  // Every member checks its share first, so that a refusal (a hold of the
  // pool without a record yet: a CreateStep in flight) or a member away
  // stops the call before anything changes.
  v1::DeletePoolRequest check = request;
  check.set_dry_run(true);
  bool anywhere = model.has_value();
  for (absl::StatusOr<v1::MemberPoolDeletion>& share :
       AskEveryMember(cluster, store, members, check, options)) {
    RETURN_IF_ERROR(share.status());
    anywhere = anywhere || !share->absent();
    if (request.dry_run()) *response.add_members() = *std::move(share);
  }
  if (!anywhere) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool, "\" has no registered model in cluster \"",
                                            cluster->options().name, "\" and no member holds it"));
  }
  if (request.dry_run()) {
    for (const std::string& id : live) response.add_released_steps(id);
  } else {
    std::vector<std::string> released;
    for (const std::string& id : live) {
      absl::StatusOr<ReleaseResult> r = steps->ReleaseStep(id);
      if (!r.ok() && !absl::IsNotFound(r.status())) {
        return absl::Status(r.status().code(),
                            absl::StrCat("pool \"", pool, "\": releasing step \"", id,
                                         "\" (released before it: ", NameAll(released, "none"),
                                         "; nothing of the pool deleted): ", r.status().message()));
      }
      if (r.ok() && options.on_step_released) options.on_step_released(*r);
      released.push_back(id);
      response.add_released_steps(id);
    }
    // etcd's facts go before the members' shares. A member holding no share
    // of a pool adopts it from etcd when a sample for it arrives
    // (SampleStore::GetOrAdoptModel): were the shares deleted first, a
    // producer still sending could have a member adopt the pool again between
    // its share's deletion and etcd's, and those samples would outlive the
    // pool. With the facts gone first, a put reaches a share deleted a moment
    // later, or is NOT_FOUND. A RegisterModel racing the deletion creates
    // the pool anew in etcd: a member whose old share is still there refuses
    // other options or another model until its share goes (a retry then
    // works), and a share registered again after its old one went is the new
    // pool's. One transaction: no member finds a model without its options.
    RETURN_IF_ERROR(cluster->etcd()
                        ->DeleteAll({cluster->Key("pools", pool), cluster->Key("pool-options", pool),
                                     cluster->Key("schemas", pool)})
                        .status());
    std::vector<std::string> done, failed;
    absl::Status first_failure;
    std::vector<absl::StatusOr<v1::MemberPoolDeletion>> shares =
        AskEveryMember(cluster, store, members, request, options);
    for (size_t m = 0; m < members.size(); ++m) {
      v1::MemberPoolDeletion* out = response.add_members();
      if (!shares[m].ok()) {
        out->set_member(members[m].id);
        out->set_error(std::string(shares[m].status().message()));
        failed.push_back(members[m].id);
        if (first_failure.ok()) first_failure = shares[m].status();
        continue;
      }
      *out = *std::move(shares[m]);
      done.push_back(members[m].id);
    }
    if (!failed.empty()) {
      // A member that did not answer is UNAVAILABLE (FromPeer); one that
      // refused (a step it holds samples for was made meanwhile) keeps its code.
      return absl::Status(first_failure.code(), absl::StrCat(
          "pool \"", pool, "\" is deleted from etcd and on ", NameAll(done, "no member"),
          ", not on ", absl::StrJoin(failed, ", "), ": ", first_failure.message(),
          "; the same call again finishes it"));
    }
  }
  for (const v1::MemberPoolDeletion& share : response.members()) {
    response.set_deleted_samples(response.deleted_samples() + share.deleted_samples());
    response.set_deleted_bytes(response.deleted_bytes() + share.deleted_bytes());
  }
  return response;
}

absl::StatusOr<v1::ListSamplesResponse> ListSamplesOverCluster(
    Cluster* cluster, SampleStore* store, const v1::ListSamplesRequest& request,
    const ClusterPoolsOptions& options) {
  ASSIGN_OR_RETURN(SampleStore::SamplePageRequest page, SamplePageRequestOf(request));
  ASSIGN_OR_RETURN(std::vector<ClusterMember> members, cluster->Members());
  v1::ListSamplesRequest local = request;
  local.set_local_only(true);
  std::vector<absl::StatusOr<v1::ListSamplesResponse>> pages(members.size());
  ForEachParallel(members.size(), [&](size_t m) {
    if (members[m].id == cluster->self().id) {
      pages[m] = ListLocalSamples(store, local, members[m].id);
      return;
    }
    v1::ListSamplesResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, options.member_timeout);
    absl::Status s = FromPeer(
        cluster->RolloutsStub(members[m])->ListSamples(&context, local, &response),
        members[m].id, "ListSamples");
    if (s.ok()) {
      pages[m] = std::move(response);
    } else {
      pages[m] = s;
    }
  });
  // Each member's page is its first ids after the token: the cluster's
  // first page_size ids are among them.
  struct Entry {
    size_t member;
    v1::SampleInfo* info;
  };
  std::vector<Entry> merged;
  bool any = false, more = false;
  for (size_t m = 0; m < members.size(); ++m) {
    if (absl::IsNotFound(pages[m].status())) continue;
    RETURN_IF_ERROR(pages[m].status());
    any = true;
    more = more || !pages[m]->next_page_token().empty();
    for (v1::SampleInfo& info : *pages[m]->mutable_samples()) {
      // The member says who it is; a peer's word is checked against whom it was asked.
      info.set_member(members[m].id);
      merged.push_back({m, &info});
    }
  }
  if (!any) {
    return absl::NotFoundError(absl::StrCat("pool \"", request.pool(), "\" is on no member of cluster \"",
                                            cluster->options().name, "\""));
  }
  std::sort(merged.begin(), merged.end(), [](const Entry& a, const Entry& b) {
    if (a.info->sample_id() != b.info->sample_id()) return a.info->sample_id() < b.info->sample_id();
    return a.member < b.member;
  });
  size_t take = std::min(merged.size(), static_cast<size_t>(page.limit));
  // An id on two members stays on one page, so the token (an id) skips none.
  while (take > 0 && take < merged.size() &&
         merged[take].info->sample_id() == merged[take - 1].info->sample_id()) {
    ++take;
  }
  v1::ListSamplesResponse response;
  for (size_t i = 0; i < take; ++i) *response.add_samples() = std::move(*merged[i].info);
  if ((more || take < merged.size()) && take > 0) {
    response.set_next_page_token(SamplesPageToken(response.samples(take - 1).sample_id()));
  }
  return response;
}

}  // namespace rollpack
