#include "server/ops/token_gate.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace rollpack {

bool IsOpenMethod(const std::string& method) {
  return absl::StartsWith(method, "/grpc.health.") || absl::StartsWith(method, "/grpc.reflection.");
}

void TokenGate::Log(const std::string& method, const grpc::AuthContext& context,
                    const grpc::Status& status) {
  // A made-up method name is the client's text: one key (and line) for all.
  const bool known = MethodRoles().count(method) > 0;
  const std::string shown = known ? method : "a method rollpackd does not serve";
  int64_t dropped = 0;
  if (!log_limit_.Allow(absl::StrCat(shown, " ", status.error_code()), absl::Now(), &dropped)) {
    return;
  }
  std::string who;
  for (const grpc::string_ref& id : context.GetPeerIdentity()) {
    absl::StrAppend(&who, who.empty() ? " from " : ",", absl::string_view(id.data(), id.size()));
  }
  spdlog::warn("{}{}: {} \"{}\" from its headers, before any message was read{}", shown, who,
               status.error_code() == grpc::StatusCode::UNAUTHENTICATED ? "UNAUTHENTICATED"
                                                                         : "PERMISSION_DENIED",
               status.error_message(),
               dropped > 0 ? absl::StrCat(" (", dropped, " more not logged)") : "");
}

grpc::Status TokenGate::Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                                OutputMetadata* /*consumed_auth_metadata*/,
                                OutputMetadata* /*response_metadata*/) {
  std::string method;
  std::string authorization;
  for (const auto& [key, value] : auth_metadata) {
    const absl::string_view k(key.data(), key.size());
    if (k == ":path") {
      method.assign(value.data(), value.size());
    } else if (k == "authorization" && authorization.empty()) {
      // The first, as the handlers' check reads it.
      authorization.assign(value.data(), value.size());
    }
  }
  if (IsOpenMethod(method)) return grpc::Status::OK;
  const auto& table = MethodRoles();
  if (table.find(method) == table.end()) {
    // Not a rollpack method: refuse a caller without a known token, and let
    // gRPC answer UNIMPLEMENTED to one with it (the role table has no row).
    if (!auth_->enabled()) return grpc::Status::OK;
    Role role;
    grpc::Status status = auth_->Authenticate(authorization, &role);
    if (!status.ok()) {
      unauthenticated_.Increment();
      Log(method, *context, status);
    }
    return status;
  }
  grpc::Status status = auth_->CheckCall(authorization, context, method);
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    unauthenticated_.Increment();
  } else if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    permission_denied_.Increment();
  }
  if (!status.ok()) Log(method, *context, status);
  return status;
}

}  // namespace rollpack
