#include "server/cluster/member_service.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/cluster/member_status.h"
#include "server/store/convert.h"
#include "server/store/log_records.h"

namespace rollpack {
namespace {

// A batch of ReadSamples: large enough to amortise a message, small enough
// that a stream holds little encoded data at a time.
constexpr int64_t kReadBatchBytes = 4 << 20;

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

std::vector<std::string> Ids(const google::protobuf::RepeatedPtrField<std::string>& ids) {
  return std::vector<std::string>(ids.begin(), ids.end());
}

// Encodes the samples batch by batch, each only once the previous write
// is done.
class ReadSamplesReactor final : public grpc::ServerWriteReactor<v1::SampleBatch> {
 public:
  // `routing`: empty, or each sample's recompute routing (a RECOMPUTE hold).
  ReadSamplesReactor(std::string pool, std::vector<std::shared_ptr<const StoredSample>> samples,
                     std::vector<std::shared_ptr<const std::string>> routing)
      : pool_(std::move(pool)), samples_(std::move(samples)), routing_(std::move(routing)) {
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed by the peer"));
      return;
    }
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (next_ >= samples_.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    std::vector<const StoredSample*> batch;
    int64_t bytes = 0;
    message_.clear_recompute_routing();
    while (next_ < samples_.size() && (batch.empty() || bytes < kReadBatchBytes)) {
      batch.push_back(samples_[next_].get());
      bytes += EncodedSampleBytes(*samples_[next_]);
      if (!routing_.empty()) {
        message_.add_recompute_routing(*routing_[next_]);
        bytes += static_cast<int64_t>(routing_[next_]->size());
      }
      ++next_;
    }
    // Ragged fields travel in the form that carries them; a batch without
    // them is encoded as it always was.
    const bool ragged = std::any_of(batch.begin(), batch.end(), [](const StoredSample* s) {
      return !s->ragged_fields.empty();
    });
    const RecordType type = ragged ? RecordType::kRaggedSamples : RecordType::kPutSamples;
    message_.set_record_type(ragged ? static_cast<uint32_t>(type) : 0);
    message_.set_encoded(EncodeSamples(pool_, absl::MakeConstSpan(batch), type));
    StartWrite(&message_);
  }

  const std::string pool_;
  const std::vector<std::shared_ptr<const StoredSample>> samples_;
  const std::vector<std::shared_ptr<const std::string>> routing_;
  size_t next_ = 0;
  v1::SampleBatch message_;
};

class FailedRead final : public grpc::ServerWriteReactor<v1::SampleBatch> {
 public:
  explicit FailedRead(const absl::Status& status) : FailedRead(ToGrpcStatus(status)) {}
  explicit FailedRead(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Whether the caller may call the Member method `method`: the member
// certificate when the cluster runs with mutual TLS (server/ops/auth.h).
grpc::Status Admit(const Authorizer* auth, const grpc::CallbackServerContext& context,
                   const char* method) {
  if (auth == nullptr) return grpc::Status::OK;
  return auth->Check(context, method);
}

// Null when admitted, else the reactor that refused the call.
grpc::ServerUnaryReactor* Refused(const Authorizer* auth, grpc::CallbackServerContext* context,
                                  const char* method) {
  grpc::Status status = Admit(auth, *context, method);
  if (status.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* MemberService::ListFreeSamples(grpc::CallbackServerContext* context,
                                                         const v1::ListFreeSamplesRequest* request,
                                                         v1::FreeSamples* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/ListFreeSamples")) return refused;
  const std::vector<std::string> ids = Ids(request->sample_ids());
  absl::StatusOr<SampleStore::SampleListing> listing = store_->ListSamples(
      request->pool(), ids, request->all_with_metadata() ? -1 : request->limit());
  if (listing.ok()) {
    for (const std::string& id : listing->sample_ids) response->add_sample_ids(id);
    response->mutable_num_tokens()->Assign(listing->num_tokens.begin(), listing->num_tokens.end());
    response->mutable_arrival_unix_nanos()->Assign(listing->arrival_unix_nanos.begin(),
                                                   listing->arrival_unix_nanos.end());
    for (bool free : listing->free) response->add_free(free);
    for (const std::string& group : listing->group_ids) response->add_group_ids(group);
    response->mutable_group_sizes()->Assign(listing->group_sizes.begin(),
                                            listing->group_sizes.end());
    response->mutable_policy_versions()->Assign(listing->policy_versions.begin(),
                                                listing->policy_versions.end());
    for (const std::string& id : listing->open_sample_ids) response->add_open_sample_ids(id);
    response->set_lifecycle(true);
    for (const std::string& name : listing->missing_scalars) response->add_missing_scalars(name);
    response->mutable_ready_unix_nanos()->Assign(listing->ready_unix_nanos.begin(),
                                                 listing->ready_unix_nanos.end());
    response->set_annotations(true);
    Cluster* const cluster = steps_->cluster();
    response->set_draining(cluster != nullptr && cluster->self_drained());
  }
  return Finish(context, listing.status());
}

grpc::ServerUnaryReactor* MemberService::HoldSamples(grpc::CallbackServerContext* context,
                                                     const v1::HoldSamplesRequest* request,
                                                     v1::HoldSamplesResponse* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/HoldSamples")) return refused;
  response->set_lifecycle(true);
  response->set_incarnation(steps_->incarnation());
  const std::vector<std::string> ids = Ids(request->sample_ids());
  absl::Status held = store_->Hold(request->step_id(), request->pool(), ids,
                                   request->coordinator(), request->attempt(),
                                   request->reuse_samples(),
                                   request->replay_source() == v1::REPLAY_SOURCE_RECOMPUTE);
  if (!held.ok()) return Finish(context, held);
  // The planner's per-sequence metadata and advantages (lifecycle.md
  // section 6): each sample's scalars as held, frozen while the step lives.
  absl::StatusOr<std::vector<std::shared_ptr<const StoredSample>>> samples =
      store_->HeldSamples(request->step_id(), ids);
  if (!samples.ok()) return Finish(context, samples.status());
  response->set_sends_scalars(true);
  for (const auto& sample : *samples) {
    response->add_scalars()->mutable_values()->insert(sample->scalars.begin(),
                                                      sample->scalars.end());
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MemberService::ConfirmHold(grpc::CallbackServerContext* context,
                                                     const v1::StepHoldRequest* request,
                                                     v1::ConfirmHoldResponse*) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/ConfirmHold")) return refused;
  return Finish(context, store_->ConfirmHold(request->step_id()));
}

grpc::ServerUnaryReactor* MemberService::DropHold(grpc::CallbackServerContext* context,
                                                  const v1::StepHoldRequest* request,
                                                  v1::DropHoldResponse* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/DropHold")) return refused;
  absl::StatusOr<ReleaseResult> dropped =
      store_->DropHold(request->step_id(), request->attempt());
  if (dropped.ok()) response->set_released_samples(dropped->released_samples);
  return Finish(context, dropped.status());
}

grpc::ServerUnaryReactor* MemberService::ReleaseHold(grpc::CallbackServerContext* context,
                                                     const v1::StepHoldRequest* request,
                                                     v1::DropHoldResponse* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/ReleaseHold")) return refused;
  absl::StatusOr<ReleaseResult> released = store_->ReleaseHold(request->step_id());
  steps_->DropStaleRoutingStages();  // this member's R2 stage of the step, if any
  if (released.ok()) {
    response->set_released_samples(released->released_samples);
    response->set_returned_samples(released->returned_samples);
    response->set_freed_bytes(released->freed_bytes);
  }
  return Finish(context, released.status());
}

grpc::ServerUnaryReactor* MemberService::DropGroups(grpc::CallbackServerContext* context,
                                                    const v1::DropGroupsRequest* request,
                                                    v1::DropGroupsResponse* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/DropGroups")) return refused;
  absl::StatusOr<DropResult> dropped = store_->DropGroups(
      request->pool(), Ids(request->group_ids()), /*count=*/false);
  if (dropped.ok()) response->set_dropped_samples(dropped->group_samples);
  return Finish(context, dropped.status());
}

grpc::ServerUnaryReactor* MemberService::StepStreams(grpc::CallbackServerContext* context,
                                                     const v1::StepStreamsRequest* request,
                                                     v1::StepStreamsResponse* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/StepStreams")) return refused;
  const absl::Time now = absl::Now();
  for (const std::string& id : request->step_ids()) {
    v1::StepStreams* out = response->add_steps();
    out->set_step_id(id);
    if (activity_ == nullptr) continue;
    const StepActivity::Entry e = activity_->Get(id, now);
    out->set_streams_open(e.streams_open);
    if (e.last_stream != absl::InfinitePast()) {
      out->set_last_stream_unix_nanos(absl::ToUnixNanos(e.last_stream));
    }
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::SampleBatch>* MemberService::ReadSamples(
    grpc::CallbackServerContext* context, const v1::ReadSamplesRequest* request) {
  if (grpc::Status s = Admit(auth_, *context, "/rollpack.v1.Member/ReadSamples"); !s.ok()) {
    return new FailedRead(s);
  }
  const std::vector<std::string> ids = Ids(request->sample_ids());
  absl::StatusOr<std::vector<std::shared_ptr<const StoredSample>>> samples =
      store_->HeldSamples(request->step_id(), ids);
  if (!samples.ok()) {
    // Called from another member's pull: the step's record says whether
    // this member lost them with its data (DATA_LOSS, the trainer's answer).
    return new FailedRead(
        steps_->ExplainMissingHold(request->step_id(), ids, samples.status()));
  }
  // R2: a RECOMPUTE hold sends the routing it took with its samples.
  absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> routing =
      store_->HeldRecomputeRouting(request->step_id(), ids);
  if (!routing.ok() && !absl::IsFailedPrecondition(routing.status())) {
    return new FailedRead(routing.status());
  }
  // The pool travels in every batch (the log encoding's framing); the
  // reader checks nothing of it.
  return new ReadSamplesReactor(
      request->step_id(), *std::move(samples),
      routing.ok() ? *std::move(routing) : std::vector<std::shared_ptr<const std::string>>());
}

grpc::ServerUnaryReactor* MemberService::StageRouting(grpc::CallbackServerContext* context,
                                                      const v1::StageRoutingRequest* request,
                                                      v1::UploadRoutingResponse* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/StageRouting")) return refused;
  return OffThread(context, [this, request, response] {
    absl::StatusOr<RoutingUploadResult> staged = steps_->StageHeldRouting(*request);
    if (!staged.ok()) return staged.status();
    response->set_rows(staged->rows);
    response->set_repeated_rows(staged->repeated_rows);
    response->set_missing_entries(staged->missing_entries);
    return absl::OkStatus();
  });
}

namespace {

absl::Status SetCommitResponse(const absl::StatusOr<RoutingCommitResult>& result,
                               v1::CommitRoutingResponse* response) {
  if (!result.ok()) return result.status();
  response->set_samples(result->samples);
  response->set_tokens(result->tokens);
  response->set_stored_bytes(result->stored_bytes);
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* MemberService::CheckRouting(grpc::CallbackServerContext* context,
                                                      const v1::MemberRoutingRequest* request,
                                                      v1::CommitRoutingResponse* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/CheckRouting")) return refused;
  return OffThread(context, [this, request, response] {
    return SetCommitResponse(steps_->CheckHeldRouting(request->step_id(), request->attempt()),
                             response);
  });
}

grpc::ServerUnaryReactor* MemberService::CommitRouting(grpc::CallbackServerContext* context,
                                                       const v1::MemberRoutingRequest* request,
                                                       v1::CommitRoutingResponse* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/CommitRouting")) return refused;
  return OffThread(context, [this, request, response] {
    return SetCommitResponse(steps_->CommitHeldRouting(request->step_id(), request->attempt()),
                             response);
  });
}

grpc::ServerUnaryReactor* MemberService::PrepareAnnotations(
    grpc::CallbackServerContext* context, const v1::PrepareAnnotationsRequest* request,
    v1::PrepareAnnotationsResponse* /*response*/) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/PrepareAnnotations")) {
    return refused;
  }
  std::vector<ScalarAnnotation> annotations;
  annotations.reserve(request->annotations_size());
  for (const v1::SampleAnnotation& a : request->annotations()) {
    annotations.push_back(ScalarAnnotation{
        a.sample_id(), std::map<std::string, double>(a.scalars().begin(), a.scalars().end())});
  }
  return Finish(context, store_->PrepareAnnotations(request->pool(), request->ticket(),
                                                    std::move(annotations),
                                                    absl::Milliseconds(request->ttl_ms())));
}

grpc::ServerUnaryReactor* MemberService::CommitAnnotations(
    grpc::CallbackServerContext* context, const v1::AnnotationTicketRequest* request,
    v1::CommitAnnotationsResponse* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/CommitAnnotations")) {
    return refused;
  }
  absl::StatusOr<int32_t> committed = store_->CommitAnnotations(request->pool(), request->ticket());
  if (committed.ok()) response->set_annotated(*committed);
  return Finish(context, committed.status());
}

grpc::ServerUnaryReactor* MemberService::AbortAnnotations(
    grpc::CallbackServerContext* context, const v1::AnnotationTicketRequest* request,
    v1::PrepareAnnotationsResponse* /*response*/) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/AbortAnnotations")) {
    return refused;
  }
  return Finish(context, store_->AbortAnnotations(request->pool(), request->ticket()));
}

grpc::ServerUnaryReactor* MemberService::OffThread(grpc::CallbackServerContext* context,
                                                   absl::AnyInvocable<absl::Status() &&> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // An owner's R2 work may read etcd and writes the log: never on one of
  // gRPC's callback threads.
  routing_calls_.Schedule([reactor, work = std::move(work)]() mutable {
    reactor->Finish(ToGrpcStatus(std::move(work)()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* MemberService::LocalStatus(grpc::CallbackServerContext* context,
                                                     const v1::LocalStatusRequest* request,
                                                     v1::ClusterMemberStatus* response) {
  if (auto* refused = Refused(auth_, context, "/rollpack.v1.Member/LocalStatus")) return refused;
  // Re-reading the drain key waits on etcd: off gRPC's handler thread.
  return OffThread(context, [this, request, response]() -> absl::Status {
    Cluster* const cluster = steps_->cluster();
    if (cluster == nullptr) return absl::UnavailableError("this member is not in its cluster");
    if (request->reread_drain()) RETURN_IF_ERROR(cluster->RefreshSelfDrained());
    *response = LocalMemberStatus(*store_, cluster->self().id, cluster->self_drained());
    return absl::OkStatus();
  });
}

}  // namespace rollpack
