// gRPC adapter of the producer side: register models, stream samples in.
#ifndef ROLLPACK_SERVER_ROLLOUTS_SERVICE_H_
#define ROLLPACK_SERVER_ROLLOUTS_SERVICE_H_

#include "rollpack/v1/rollouts.grpc.pb.h"
#include "server/auth.h"
#include "server/sample_store.h"
#include "server/server_metrics.h"

namespace rollpack {

class RolloutsService final : public v1::Rollouts::CallbackService {
 public:
  // `metrics` and `auth` may be null (no metrics, no auth).
  explicit RolloutsService(SampleStore* store, ServerMetrics* metrics = nullptr,
                          const Authorizer* auth = nullptr)
      : store_(store), metrics_(metrics), auth_(auth) {}

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
  ServerMetrics* const metrics_;
  const Authorizer* const auth_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_ROLLOUTS_SERVICE_H_
