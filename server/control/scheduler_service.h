// gRPC adapter of planning: create steps, read plans, release steps.
#ifndef ROLLPACK_SERVER_CONTROL_SCHEDULER_SERVICE_H_
#define ROLLPACK_SERVER_CONTROL_SCHEDULER_SERVICE_H_

#include <cstdint>

#include "rollpack/v1/scheduler.grpc.pb.h"
#include "server/ops/auth.h"
#include "server/store/step_activity.h"
#include "server/store/step_directory.h"
#include "server/ops/server_metrics.h"

namespace rollpack {

class SchedulerService final : public v1::Scheduler::CallbackService {
 public:
  // `steps`: the store's own (LocalSteps) or the cluster's. `metrics`,
  // `auth` and `activity` may be null (no metrics, no auth, no stream
  // counts in ListSteps). `max_samples_per_step`: 0 = no limit.
  explicit SchedulerService(StepDirectory* steps, ServerMetrics* metrics = nullptr,
                           const Authorizer* auth = nullptr, StepActivity* activity = nullptr,
                           int64_t max_samples_per_step = 0)
      : steps_(steps),
        metrics_(metrics),
        auth_(auth),
        activity_(activity),
        max_samples_per_step_(max_samples_per_step) {}

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
  grpc::ServerUnaryReactor* ListSteps(grpc::CallbackServerContext* context,
                                      const v1::ListStepsRequest* request,
                                      v1::ListStepsResponse* response) override;

 private:
  // ListSteps of one step id.
  absl::StatusOr<std::vector<LiveStep>> OneStep(const std::string& step_id,
                                                const std::string& pool);
  // Auth, then `body`'s status.
  template <typename Body>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context, const char* method,
                                  Body body);

  StepDirectory* const steps_;
  ServerMetrics* const metrics_;
  const Authorizer* const auth_;
  StepActivity* const activity_;
  const int64_t max_samples_per_step_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CONTROL_SCHEDULER_SERVICE_H_
