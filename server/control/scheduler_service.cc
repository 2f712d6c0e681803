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
  const std::vector<std::string> ids(request->sample_ids().begin(), request->sample_ids().end());
  absl::StatusOr<std::shared_ptr<const Step>> step = steps_->CreateStep(
      request->step_id(), request->pool(), ids, request->num_samples(), *topology);
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
    if (metrics_ != nullptr) metrics_->OnStepReleased(result->released_samples, result->freed_bytes);
  }
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

}  // namespace rollpack
