// gRPC adapter of delivery: stream one rank's micro-batches of a step.
#ifndef ROLLPACK_SERVER_TRAINER_SERVICE_H_
#define ROLLPACK_SERVER_TRAINER_SERVICE_H_

#include "rollpack/v1/trainer.grpc.pb.h"
#include "server/sample_store.h"

namespace rollpack {

class TrainerService final : public v1::Trainer::CallbackService {
 public:
  explicit TrainerService(SampleStore* store) : store_(store) {}

  grpc::ServerWriteReactor<v1::Microbatch>* FetchMicrobatches(
      grpc::CallbackServerContext* context, const v1::FetchRequest* request) override;

 private:
  SampleStore* const store_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_TRAINER_SERVICE_H_
