// Token checks at call start, before gRPC reads any request message.
//
// The per-handler check (Authorizer::Check) runs after gRPC has received and
// parsed the request: an unauthenticated client could make rollpackd buffer
// --max-message-bytes per call before being refused (8 unary calls of 530 MB
// reached 4.75 GB RSS). The gate is a gRPC AuthMetadataProcessor: the
// server's auth filter runs it on the call's initial metadata and cancels
// a refused call there, so at most a flow-control window of its message is
// ever received. It refuses exactly what Authorizer::CheckHeader refuses,
// with the same codes and messages; handlers keep their own check.
#ifndef ROLLPACK_SERVER_OPS_TOKEN_GATE_H_
#define ROLLPACK_SERVER_OPS_TOKEN_GATE_H_

#include <string>

#include "grpcpp/security/auth_metadata_processor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "server/ops/auth.h"
#include "server/ops/log_rate_limiter.h"

namespace rollpack {

class TokenGate final : public grpc::AuthMetadataProcessor {
 public:
  // `auth` (enabled) and `refused` outlive the gate, which gRPC owns with
  // the server. Each refusal counts in `refused`, labelled by code.
  TokenGate(const Authorizer* auth, prometheus::Family<prometheus::Counter>* refused)
      : auth_(auth),
        unauthenticated_(refused->Add({{"code", "UNAUTHENTICATED"}})),
        permission_denied_(refused->Add({{"code", "PERMISSION_DENIED"}})) {}

  // Runs on gRPC's thread: a table lookup and a constant-time compare.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

  // The Prometheus family the server registers for the gate's refusals.
  static constexpr const char* kRefusedMetric = "rollpack_calls_refused_at_start_total";

 private:
  // A warning per refusal, at most 10 a minute per method and code.
  void Log(const std::string& method, const grpc::AuthContext& context,
           const grpc::Status& status);

  const Authorizer* const auth_;
  LogRateLimiter log_limit_{10, absl::Minutes(1)};
  prometheus::Counter& unauthenticated_;
  prometheus::Counter& permission_denied_;
};

// Whether `method` (":path") is open without a token: health checks and
// server reflection.
bool IsOpenMethod(const std::string& method);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_TOKEN_GATE_H_
