#include "server/control/telemetry_service.h"

#include <memory>

#include "server/store/convert.h"

namespace rollpack {

grpc::ServerUnaryReactor* TelemetryService::ReportRoutingAgreement(
    grpc::CallbackServerContext* context, const v1::RoutingAgreementReport* request,
    v1::RoutingAgreementAck* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Telemetry/ReportRoutingAgreement");
        !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  absl::StatusOr<std::shared_ptr<const Step>> step = store_->GetStep(request->step_id());
  if (!step.ok()) {
    reactor->Finish(ToGrpcStatus(step.status()));
    return reactor;
  }
  absl::StatusOr<v1::RoutingAgreementAck> ack = book_->Record(*step, *request);
  if (ack.ok()) *response = *std::move(ack);
  reactor->Finish(ToGrpcStatus(ack.status()));
  return reactor;
}

}  // namespace rollpack
