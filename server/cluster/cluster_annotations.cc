#include "server/cluster/cluster_annotations.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/cluster/peer_calls.h"
#include "server/store/names.h"

namespace rollpack {
namespace {

// Tickets are unique per call: this member's id, a counter and the time
// (a restarted member starts its counter again).
std::string NewTicket(const Cluster& cluster) {
  static std::atomic<int64_t> counter{0};
  return absl::StrCat(cluster.self().id, "/", absl::GetCurrentTimeNanos(), "/",
                      counter.fetch_add(1));
}

v1::PrepareAnnotationsRequest PrepareRequest(const std::string& pool, const std::string& ticket,
                                             const std::vector<ScalarAnnotation>& share,
                                             absl::Duration ttl) {
  v1::PrepareAnnotationsRequest request;
  request.set_pool(pool);
  request.set_ticket(ticket);
  request.set_ttl_ms(absl::ToInt64Milliseconds(ttl));
  for (const ScalarAnnotation& a : share) {
    v1::SampleAnnotation* out = request.add_annotations();
    out->set_sample_id(a.sample_id);
    out->mutable_scalars()->insert(a.scalars.begin(), a.scalars.end());
  }
  return request;
}

}  // namespace

absl::StatusOr<int32_t> AnnotateOverCluster(Cluster* cluster, SampleStore* store,
                                            const std::string& pool,
                                            std::vector<ScalarAnnotation> annotations,
                                            const ClusterAnnotateOptions& options) {
  // Refused here as on a single server, before any member is asked.
  RETURN_IF_ERROR(ValidateName("pool name", pool, kMaxPoolNameBytes));
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> ids;
  ids.reserve(annotations.size());
  for (const ScalarAnnotation& a : annotations) {
    RETURN_IF_ERROR(ValidateName("sample_id", a.sample_id, kMaxSampleIdBytes));
    if (!seen.insert(a.sample_id).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample \"", a.sample_id, "\" appears twice in one AnnotateSamples request; give each "
          "sample one entry with all its scalars"));
    }
    ids.push_back(a.sample_id);
  }
  ASSIGN_OR_RETURN(std::optional<ModelSpec> model, cluster->LookupPool(pool));
  if (!model.has_value()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool, "\" has no registered model in cluster \"",
                                            cluster->options().name, "\""));
  }
  if (annotations.empty()) return 0;
  ASSIGN_OR_RETURN(std::vector<ClusterMember> members, cluster->Members());
  const size_t n = members.size();
  auto is_self = [&](size_t m) { return members[m].id == cluster->self().id; };

  // Who holds each sample, sealed or open.
  std::vector<absl::Status> listed(n);
  std::vector<std::vector<std::string>> held(n);
  ForEachParallel(n, [&](size_t m) {
    if (is_self(m)) {
      absl::StatusOr<SampleStore::SampleListing> listing = store->ListSamples(pool, ids, -1);
      listed[m] = listing.status();
      if (!listing.ok()) return;
      held[m] = std::move(listing->sample_ids);
      held[m].insert(held[m].end(), listing->open_sample_ids.begin(),
                     listing->open_sample_ids.end());
      return;
    }
    v1::ListFreeSamplesRequest request;
    request.set_pool(pool);
    for (const std::string& id : ids) request.add_sample_ids(id);
    v1::FreeSamples response;
    grpc::ClientContext context;
    SetDeadline(&context, options.member_timeout);
    listed[m] = FromPeer(cluster->MemberStub(members[m])->ListFreeSamples(&context, request,
                                                                           &response),
                         members[m].id, "ListFreeSamples");
    held[m].assign(response.sample_ids().begin(), response.sample_ids().end());
    held[m].insert(held[m].end(), response.open_sample_ids().begin(),
                   response.open_sample_ids().end());
  });
  absl::flat_hash_map<std::string, size_t> owner;
  for (size_t m = 0; m < n; ++m) {
    // A member that never saw the pool holds none of its samples.
    if (absl::IsNotFound(listed[m])) continue;
    RETURN_IF_ERROR(listed[m]);
    for (const std::string& id : held[m]) {
      auto [it, inserted] = owner.try_emplace(id, m);
      if (!inserted) {
        return absl::FailedPreconditionError(absl::StrCat(
            "sample \"", id, "\" of pool \"", pool, "\" is held by two members, ",
            members[it->second].id, " and ", members[m].id));
      }
    }
  }
  // Each owner's share, in the request's order; `first` orders the owners
  // by their first entry, so the refusal reported is the earliest one's.
  std::vector<std::vector<ScalarAnnotation>> share(n);
  std::vector<size_t> first(n, std::numeric_limits<size_t>::max());
  for (size_t i = 0; i < annotations.size(); ++i) {
    auto it = owner.find(annotations[i].sample_id);
    if (it == owner.end()) {
      return absl::NotFoundError(absl::StrCat("sample \"", annotations[i].sample_id,
                                              "\" is not in pool \"", pool, "\" on any of the ",
                                              n, " members"));
    }
    first[it->second] = std::min(first[it->second], i);
    share[it->second].push_back(std::move(annotations[i]));
  }
  std::vector<size_t> owners;
  for (size_t m = 0; m < n; ++m) {
    if (!share[m].empty()) owners.push_back(m);
  }
  std::sort(owners.begin(), owners.end(), [&](size_t a, size_t b) { return first[a] < first[b]; });

  const std::string ticket = NewTicket(*cluster);
  v1::AnnotationTicketRequest ticket_request;
  ticket_request.set_pool(pool);
  ticket_request.set_ticket(ticket);
  auto abort_all = [&](const std::vector<size_t>& which) {
    // Best effort: a share not aborted lapses at its ttl.
    ForEachParallel(which.size(), [&](size_t k) {
      const size_t m = which[k];
      if (is_self(m)) {
        store->AbortAnnotations(pool, ticket).IgnoreError();
        return;
      }
      v1::PrepareAnnotationsResponse response;
      grpc::ClientContext context;
      SetDeadline(&context, options.member_timeout);
      cluster->MemberStub(members[m])->AbortAnnotations(&context, ticket_request, &response);
    });
  };

  // Phase one: every share checked and reserved, or none kept.
  std::vector<absl::Status> prepared(owners.size());
  ForEachParallel(owners.size(), [&](size_t k) {
    const size_t m = owners[k];
    if (is_self(m)) {
      prepared[k] = store->PrepareAnnotations(pool, ticket, share[m], options.reservation_ttl);
      return;
    }
    const v1::PrepareAnnotationsRequest request =
        PrepareRequest(pool, ticket, share[m], options.reservation_ttl);
    v1::PrepareAnnotationsResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, options.member_timeout);
    prepared[k] = FromPeer(
        cluster->MemberStub(members[m])->PrepareAnnotations(&context, request, &response),
        members[m].id, "PrepareAnnotations");
  });
  for (size_t k = 0; k < owners.size(); ++k) {
    if (prepared[k].ok()) continue;
    abort_all(owners);
    return prepared[k];
  }

  // Phase two: every share applied, durably on its owner.
  std::vector<absl::Status> committed(owners.size());
  ForEachParallel(owners.size(), [&](size_t k) {
    const size_t m = owners[k];
    if (is_self(m)) {
      committed[k] = store->CommitAnnotations(pool, ticket).status();
      return;
    }
    v1::CommitAnnotationsResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, options.member_timeout);
    committed[k] = FromPeer(
        cluster->MemberStub(members[m])->CommitAnnotations(&context, ticket_request, &response),
        members[m].id, "CommitAnnotations");
  });
  std::vector<size_t> failed;
  std::vector<std::string> done;
  absl::Status first_failure;
  for (size_t k = 0; k < owners.size(); ++k) {
    if (committed[k].ok()) {
      done.push_back(members[owners[k]].id);
      continue;
    }
    failed.push_back(owners[k]);
    if (first_failure.ok()) first_failure = committed[k];
  }
  if (failed.empty()) return static_cast<int32_t>(seen.size());
  // Freed now rather than at the ttl, so that the same call again can
  // prepare them (an abort after a commit that did land is a no-op).
  abort_all(failed);
  return absl::UnavailableError(absl::StrCat(
      "AnnotateSamples: ", failed.size(), " of ", owners.size(),
      " members did not commit their share (",
      done.empty() ? std::string("none did") : absl::StrCat("committed on ", absl::StrJoin(done, ", ")),
      "): ", first_failure.message(),
      "; the same call again completes it (what was applied is a no-op the second time)"));
}

}  // namespace rollpack
