// gRPC adapter of delivery: stream one rank's micro-batches of a step.
#ifndef ROLLPACK_SERVER_TRAINER_SERVICE_H_
#define ROLLPACK_SERVER_TRAINER_SERVICE_H_

#include <atomic>

#include "rollpack/v1/trainer.grpc.pb.h"
#include "server/auth.h"
#include "server/sample_store.h"
#include "server/server_metrics.h"

namespace rollpack {

class TrainerService final : public v1::Trainer::CallbackService {
 public:
  // `metrics` and `auth` may be null (no metrics, no auth). At most
  // `max_concurrent_streams` FetchMicrobatches run at once (0 = no limit);
  // past it a new one gets RESOURCE_EXHAUSTED.
  explicit TrainerService(SampleStore* store, ServerMetrics* metrics = nullptr,
                          const Authorizer* auth = nullptr, int max_concurrent_streams = 0)
      : store_(store), metrics_(metrics), auth_(auth),
        max_concurrent_streams_(max_concurrent_streams) {}

  int active_streams() const { return active_streams_.load(); }

  grpc::ServerWriteReactor<v1::Microbatch>* FetchMicrobatches(
      grpc::CallbackServerContext* context, const v1::FetchRequest* request) override;

 private:
  SampleStore* const store_;
  ServerMetrics* const metrics_;
  const Authorizer* const auth_;
  const int max_concurrent_streams_;
  std::atomic<int> active_streams_{0};
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_TRAINER_SERVICE_H_
