// gRPC adapter of planning: create steps, read plans, release steps.
#ifndef ROLLPACK_SERVER_CONTROL_SCHEDULER_SERVICE_H_
#define ROLLPACK_SERVER_CONTROL_SCHEDULER_SERVICE_H_

#include "rollpack/v1/scheduler.grpc.pb.h"
#include "server/ops/auth.h"
#include "server/store/step_directory.h"
#include "server/ops/server_metrics.h"

namespace rollpack {

class SchedulerService final : public v1::Scheduler::CallbackService {
 public:
  // `steps`: the store's own (LocalSteps) or the cluster's. `metrics` and
  // `auth` may be null (no metrics, no auth).
  explicit SchedulerService(StepDirectory* steps, ServerMetrics* metrics = nullptr,
                           const Authorizer* auth = nullptr)
      : steps_(steps), metrics_(metrics), auth_(auth) {}

  grpc::ServerUnaryReactor* CreateStep(grpc::CallbackServerContext* context,
                                       const v1::CreateStepRequest* request,
                                       v1::StepInfo* response) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* context,
                                    const v1::GetPlanRequest* request,
                                    v1::Plan* response) override;
  grpc::ServerUnaryReactor* ReleaseStep(grpc::CallbackServerContext* context,
                                        const v1::ReleaseStepRequest* request,
                                        v1::ReleaseStepResponse* response) override;
  grpc::ServerUnaryReactor* SetPolicyVersion(grpc::CallbackServerContext* context,
                                             const v1::SetPolicyVersionRequest* request,
                                             v1::PoolInfo* response) override;

 private:
  StepDirectory* const steps_;
  ServerMetrics* const metrics_;
  const Authorizer* const auth_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CONTROL_SCHEDULER_SERVICE_H_
