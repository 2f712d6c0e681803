#include "server/control/scheduler_service.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/ops/call_log.h"
#include "server/store/convert.h"
#include "server/store/names.h"

namespace rollpack {

template <typename Body>
grpc::ServerUnaryReactor* SchedulerService::Serve(grpc::CallbackServerContext* context,
                                                  const char* method, Body body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, method); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  reactor->Finish(ToGrpcStatus(body()));
  return reactor;
}

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
  step_request.selection.max_samples = max_samples_per_step_;
  step_request.topology = *topology;
  step_request.reuse_samples = request->reuse_samples();
  step_request.advantage = AdvantageFromProto(*request);  // checked by ValidateStepRequest
  switch (request->replay_source()) {
    case v1::REPLAY_SOURCE_ROLLOUT:
      break;
    case v1::REPLAY_SOURCE_RECOMPUTE:
      step_request.replay_source = ReplaySourceKind::kRecompute;
      break;
    default:
      reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("step \"", request->step_id(), "\": replay_source ",
                       static_cast<int>(request->replay_source()), " is not a ReplaySource"))));
      return reactor;
  }
  absl::StatusOr<std::shared_ptr<const Step>> step = steps_->CreateStep(step_request);
  if (step.ok()) {
    *response = StepInfoToProto(**step);
    if (metrics_ != nullptr) metrics_->OnStepCreated(**step);
    if (activity_ != nullptr) activity_->StepCreated((*step)->step_id, absl::Now());
    const Step& s = **step;
    const PlanStats& p = s.plan.stats;
    AnnotateCall(context,
                 absl::StrFormat("step \"%s\" in pool \"%s\": %d samples, dp%d cp%d tp%d pp%d, %d "
                                 "micro-batches per rank, imbalance %.3f, sync %.3f, padding "
                                 "%.1f%%, %d tokens, planned in %.1f ms",
                                 s.step_id, s.pool, s.sample_ids.size(), s.topology.dp,
                                 s.topology.cp, s.topology.tp, s.topology.pp, p.num_microbatches,
                                 p.rank_imbalance, p.sync, 100 * p.padding_overhead, p.num_tokens,
                                 p.plan_ms));
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
    if (activity_ != nullptr) activity_->StepReleased(request->step_id());
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

absl::StatusOr<std::vector<LiveStep>> SchedulerService::OneStep(const std::string& step_id,
                                                                const std::string& pool) {
  // One lookup, not a listing of every step (a cluster's are in etcd).
  ASSIGN_OR_RETURN(std::shared_ptr<const Step> step, steps_->GetStep(step_id));
  std::vector<LiveStep> one;
  if (pool.empty() || step->pool == pool) {
    one.push_back({step, steps_->CreatedUnixNanos(step_id), steps_->StepHolders(step_id)});
  }
  return one;
}

grpc::ServerUnaryReactor* SchedulerService::ListSteps(grpc::CallbackServerContext* context,
                                                      const v1::ListStepsRequest* request,
                                                      v1::ListStepsResponse* response) {
  return Serve(context, "/rollpack.v1.Scheduler/ListSteps", [&]() -> absl::Status {
    if (!request->step_id().empty()) {
      RETURN_IF_ERROR(ValidateName("step_id", request->step_id(), kMaxStepIdBytes));
    }
    absl::StatusOr<std::vector<LiveStep>> live =
        request->step_id().empty() ? steps_->ListSteps(request->pool())
                                   : OneStep(request->step_id(), request->pool());
    if (!live.ok()) return live.status();
    const absl::Time now = absl::Now();
    for (const LiveStep& s : *live) {
      v1::StepInfo* info = response->add_steps();
      *info = StepInfoToProto(*s.step);
      info->set_created_unix_nanos(s.created_unix_nanos);
      for (const LiveStep::Holder& h : s.holders) {
        v1::StepHolder* holder = info->add_holders();
        holder->set_member(h.member);
        holder->set_num_samples(h.num_samples);
        holder->set_num_tokens(h.num_tokens);
      }
      if (activity_ != nullptr) {
        const StepActivity::Entry e = activity_->Get(s.step->step_id, now);
        info->set_streams_started(e.streams_started);
        info->set_streams_open(e.streams_open);
        if (e.last_stream != absl::InfinitePast()) {
          info->set_last_stream_unix_nanos(absl::ToUnixNanos(e.last_stream));
        }
      }
    }
    if (!request->step_id().empty() && response->steps().empty()) {
      return absl::NotFoundError(
          absl::StrCat("step \"", request->step_id(), "\" does not exist or was released"));
    }
    return absl::OkStatus();
  });
}

}  // namespace rollpack
