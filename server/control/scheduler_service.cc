#include "server/control/scheduler_service.h"

#include <string>
#include <vector>

#include "server/store/convert.h"

namespace rollpack {

grpc::ServerUnaryReactor* SchedulerService::CreateStep(grpc::CallbackServerContext* context,
                                                       const v1::CreateStepRequest* request,
                                                       v1::StepInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Scheduler/CreateStep"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  absl::StatusOr<Topology> topology = NormalizeTopology(request->topology());
  if (!topology.ok()) {
    reactor->Finish(ToGrpcStatus(topology.status()));
    return reactor;
  }
  absl::StatusOr<SelectionRequest> selection = SelectionFromProto(*request);
  if (!selection.ok()) {
    reactor->Finish(ToGrpcStatus(selection.status()));
    return reactor;
  }
  StepRequest step_request;
  step_request.step_id = request->step_id();
  step_request.pool = request->pool();
  step_request.sample_ids.assign(request->sample_ids().begin(), request->sample_ids().end());
  step_request.selection = *selection;
  step_request.topology = *topology;
  step_request.reuse_samples = request->reuse_samples();
  absl::StatusOr<std::shared_ptr<const Step>> step = steps_->CreateStep(step_request);
  if (step.ok()) {
    *response = StepInfoToProto(**step);
    if (metrics_ != nullptr) metrics_->OnStepCreated(**step);
  }
  reactor->Finish(ToGrpcStatus(step.status()));
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::GetPlan(grpc::CallbackServerContext* context,
                                                    const v1::GetPlanRequest* request,
                                                    v1::Plan* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Scheduler/GetPlan"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  absl::StatusOr<std::shared_ptr<const Step>> step = steps_->GetStep(request->step_id());
  if (step.ok()) *response = PlanToProto(**step);
  reactor->Finish(ToGrpcStatus(step.status()));
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::ReleaseStep(grpc::CallbackServerContext* context,
                                                        const v1::ReleaseStepRequest* request,
                                                        v1::ReleaseStepResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Scheduler/ReleaseStep"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  absl::StatusOr<ReleaseResult> result = steps_->ReleaseStep(request->step_id());
  if (result.ok()) {
    response->set_released_samples(result->released_samples);
    response->set_freed_bytes(result->freed_bytes);
    response->set_returned_samples(result->returned_samples);
    if (metrics_ != nullptr) metrics_->OnStepReleased(result->released_samples, result->freed_bytes);
  }
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::SetPolicyVersion(
    grpc::CallbackServerContext* context, const v1::SetPolicyVersionRequest* request,
    v1::PoolInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Scheduler/SetPolicyVersion");
        !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  absl::StatusOr<v1::PoolInfo> info =
      steps_->SetPolicyVersion(request->pool(), request->policy_version(), request->local_only());
  if (info.ok()) *response = *std::move(info);
  reactor->Finish(ToGrpcStatus(info.status()));
  return reactor;
}

}  // namespace rollpack
