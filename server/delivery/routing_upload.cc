// TrainerService's R2 methods (docs/layout.md section 11): a rank's recorded
// routing of one micro-batch, and the step's commit.
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/delivery/trainer_service.h"
#include "server/ops/call_log.h"
#include "server/store/convert.h"

namespace rollpack {

void TrainerService::RunRoutingCall(grpc::CallbackServerContext* context,
                                    grpc::ServerUnaryReactor* reactor,
                                    absl::AnyInvocable<void() &&> call) {
  if (routing_calls_ == nullptr) {
    std::move(call)();
    return;
  }
  // A cluster member stages and commits on the other members: a wait that
  // must not hold one of gRPC's callback threads (they serve those members'
  // calls to this one). Queued calls hold their uploads: bounded.
  if (routing_calls_->queued() >= kMaxQueuedRoutingCalls) {
    reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
        kMaxQueuedRoutingCalls, " UploadRouting / CommitRouting calls wait on this member; "
        "retry later"))));
    return;
  }
  routing_calls_->Schedule([context, reactor, call = std::move(call)]() mutable {
    if (context->IsCancelled()) {  // the rank gave up while queued
      reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled by the client"));
      return;
    }
    std::move(call)();
  });
}

grpc::ServerUnaryReactor* TrainerService::UploadRouting(grpc::CallbackServerContext* context,
                                                        const v1::RecordedRouting* request,
                                                        v1::UploadRoutingResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Trainer/UploadRouting"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  RunRoutingCall(context, reactor, [this, context, request, response, reactor] {
    const absl::Status status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(UploadedRouting upload, ViewRecordedRouting(*request));
      const RankCoords coords{request->rank().dp(), request->rank().cp(), request->rank().tp(),
                              request->rank().pp()};
      ASSIGN_OR_RETURN(RoutingUploadResult result,
                       steps_->UploadRouting(request->step_id(), coords, request->index(), upload));
      response->set_rows(result.rows);
      response->set_repeated_rows(result.repeated_rows);
      response->set_missing_entries(result.missing_entries);
      AnnotateCall(context,
                   absl::StrCat("step \"", request->step_id(), "\" micro-batch ", request->index(),
                                " rank dp", coords.dp, " cp", coords.cp, " tp", coords.tp, " pp",
                                coords.pp, ": ", result.rows, " rows (", result.repeated_rows,
                                " repeated), ", result.missing_entries, " entries still missing"));
      return absl::OkStatus();
    }();
    if (metrics_ != nullptr) metrics_->OnRoutingUpload(status.ok(), response->rows());
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::CommitRouting(grpc::CallbackServerContext* context,
                                                        const v1::CommitRoutingRequest* request,
                                                        v1::CommitRoutingResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Trainer/CommitRouting"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  RunRoutingCall(context, reactor, [this, context, request, response, reactor] {
    const absl::Status status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(RoutingCommitResult result, steps_->CommitRouting(request->step_id()));
      response->set_samples(result.samples);
      response->set_tokens(result.tokens);
      response->set_stored_bytes(result.stored_bytes);
      AnnotateCall(context, absl::StrCat("step \"", request->step_id(), "\": recompute routing of ",
                                         result.samples, " samples, ", result.tokens, " tokens, ",
                                         result.stored_bytes, " bytes committed"));
      return absl::OkStatus();
    }();
    if (metrics_ != nullptr) metrics_->OnRoutingCommit(status.ok());
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

}  // namespace rollpack
