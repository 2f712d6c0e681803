// gRPC adapter of what trainers report back (Telemetry service,
// proto/rollpack/v1/telemetry.proto): routing agreement, checked against the
// step it names and exported as metrics by RoutingAgreementBook.
#ifndef ROLLPACK_SERVER_CONTROL_TELEMETRY_SERVICE_H_
#define ROLLPACK_SERVER_CONTROL_TELEMETRY_SERVICE_H_

#include "rollpack/v1/telemetry.grpc.pb.h"
#include "server/ops/auth.h"
#include "server/control/routing_agreement.h"
#include "server/store/sample_store.h"

namespace rollpack {

class TelemetryService final : public v1::Telemetry::CallbackService {
 public:
  // `auth` may be null (no auth). `store` and `book` must outlive the service.
  TelemetryService(SampleStore* store, RoutingAgreementBook* book,
                   const Authorizer* auth = nullptr)
      : store_(store), book_(book), auth_(auth) {}

  // NOT_FOUND naming the step when it does not exist (or was released);
  // INVALID_ARGUMENT as ValidateRoutingAgreementReport.
  grpc::ServerUnaryReactor* ReportRoutingAgreement(grpc::CallbackServerContext* context,
                                                   const v1::RoutingAgreementReport* request,
                                                   v1::RoutingAgreementAck* response) override;

 private:
  SampleStore* const store_;
  RoutingAgreementBook* const book_;
  const Authorizer* const auth_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CONTROL_TELEMETRY_SERVICE_H_
