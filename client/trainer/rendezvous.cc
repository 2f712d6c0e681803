#include "client/trainer/rendezvous.h"

#include <chrono>

#include "client/cpp/client.h"
#include "grpcpp/client_context.h"
#include "rollpack/v1/rendezvous.grpc.pb.h"

namespace rollpack {

absl::Status RendezvousPost(const std::shared_ptr<grpc::Channel>& channel, const std::string& key,
                            const std::string& value, const std::string& auth_token) {
  auto stub = v1::Rendezvous::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!auth_token.empty()) context.AddMetadata("authorization", "Bearer " + auth_token);
  v1::ExchangeIdRequest request;
  request.set_key(key);
  request.set_post(true);
  request.set_value(value);
  v1::ExchangeIdResponse response;
  return FromGrpcStatus(stub->ExchangeId(&context, request, &response));
}

absl::StatusOr<std::string> RendezvousWait(const std::shared_ptr<grpc::Channel>& channel,
                                           const std::string& key, int timeout_s,
                                           const std::string& auth_token) {
  auto stub = v1::Rendezvous::NewStub(channel);
  grpc::ClientContext context;
  // A few seconds beyond the server's wait, so its DEADLINE_EXCEEDED (with
  // its message) arrives before the call's own deadline cuts it off.
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s + 5));
  if (!auth_token.empty()) context.AddMetadata("authorization", "Bearer " + auth_token);
  v1::ExchangeIdRequest request;
  request.set_key(key);
  request.set_wait_ms(int64_t{timeout_s} * 1000);
  v1::ExchangeIdResponse response;
  grpc::Status s = stub->ExchangeId(&context, request, &response);
  if (!s.ok()) return FromGrpcStatus(s);
  return response.value();
}

}  // namespace rollpack
