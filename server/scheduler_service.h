// gRPC adapter of planning: create steps, read plans, release steps.
#ifndef ROLLPACK_SERVER_SCHEDULER_SERVICE_H_
#define ROLLPACK_SERVER_SCHEDULER_SERVICE_H_

#include "rollpack/v1/scheduler.grpc.pb.h"
#include "server/sample_store.h"

namespace rollpack {

class SchedulerService final : public v1::Scheduler::CallbackService {
 public:
  explicit SchedulerService(SampleStore* store) : store_(store) {}

  grpc::ServerUnaryReactor* CreateStep(grpc::CallbackServerContext* context,
                                       const v1::CreateStepRequest* request,
                                       v1::StepInfo* response) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* context,
                                    const v1::GetPlanRequest* request,
                                    v1::Plan* response) override;
  grpc::ServerUnaryReactor* ReleaseStep(grpc::CallbackServerContext* context,
                                        const v1::ReleaseStepRequest* request,
                                        v1::ReleaseStepResponse* response) override;

 private:
  SampleStore* const store_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_SCHEDULER_SERVICE_H_
