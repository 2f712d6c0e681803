#include "server/server.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace rollpack {

int64_t DefaultMaxMemoryBytes() {
  const int64_t pages = sysconf(_SC_PHYS_PAGES);
  const int64_t page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return int64_t{8} << 30;
  return pages * page_size / 2;
}

absl::StatusOr<std::unique_ptr<RollpackServer>> RollpackServer::Start(
    const ServerOptions& options) {
  std::unique_ptr<RollpackServer> server(new RollpackServer());
  server->store_ = std::make_unique<SampleStore>(
      options.max_memory_bytes > 0 ? options.max_memory_bytes : DefaultMaxMemoryBytes());
  server->rollouts_ = std::make_unique<RolloutsService>(server->store_.get());
  server->scheduler_ = std::make_unique<SchedulerService>(server->store_.get());
  server->trainer_ = std::make_unique<TrainerService>(server->store_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(server->rollouts_.get());
  builder.RegisterService(server->scheduler_.get());
  builder.RegisterService(server->trainer_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  server->port_ = port;
  server->host_ = options.listen.substr(0, options.listen.rfind(':'));
  if (server->host_.empty() || server->host_ == "0.0.0.0" || server->host_ == "[::]") {
    server->host_ = "127.0.0.1";
  }
  return server;
}

RollpackServer::~RollpackServer() { Shutdown(absl::ZeroDuration()); }

std::string RollpackServer::address() const { return absl::StrCat(host_, ":", port_); }

void RollpackServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

void RollpackServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace rollpack
