// gRPC adapter of the producer side: register models, stream samples in.
#ifndef ROLLPACK_SERVER_ROLLOUTS_SERVICE_H_
#define ROLLPACK_SERVER_ROLLOUTS_SERVICE_H_

#include "rollpack/v1/rollouts.grpc.pb.h"
#include "server/sample_store.h"

namespace rollpack {

class RolloutsService final : public v1::Rollouts::CallbackService {
 public:
  explicit RolloutsService(SampleStore* store) : store_(store) {}

  grpc::ServerUnaryReactor* RegisterModel(grpc::CallbackServerContext* context,
                                          const v1::RegisterModelRequest* request,
                                          v1::RegisterModelResponse* response) override;
  grpc::ServerReadReactor<v1::PutSamplesRequest>* PutSamples(
      grpc::CallbackServerContext* context, v1::PutSamplesResponse* response) override;
  grpc::ServerUnaryReactor* GetPool(grpc::CallbackServerContext* context,
                                    const v1::GetPoolRequest* request,
                                    v1::PoolInfo* response) override;

 private:
  SampleStore* const store_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_ROLLOUTS_SERVICE_H_
