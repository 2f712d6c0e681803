// rollpackd's gRPC server: the three services plus health and reflection,
// over one SampleStore. Used by the daemon, the CLI's embedded demo server
// and in-process tests.
#ifndef ROLLPACK_SERVER_SERVER_H_
#define ROLLPACK_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "server/rollouts_service.h"
#include "server/sample_store.h"
#include "server/scheduler_service.h"
#include "server/trainer_service.h"

namespace rollpack {

struct ServerOptions {
  // host:port; port 0 picks a free one (see RollpackServer::port()).
  std::string listen = "127.0.0.1:0";
  // Bytes of samples the store may hold; <= 0 means half the machine's RAM.
  int64_t max_memory_bytes = 0;
  // Largest gRPC message either way. One 32k-token sample of a 94-layer
  // top-8 model is 24 MB at uint8.
  int max_message_bytes = 512 << 20;
};

// Half of physical memory: the default --max-memory.
int64_t DefaultMaxMemoryBytes();

class RollpackServer {
 public:
  // Binds and starts serving. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<RollpackServer>> Start(const ServerOptions& options);
  ~RollpackServer();

  int port() const { return port_; }
  // "127.0.0.1:PORT" style address clients can dial.
  std::string address() const;
  SampleStore& store() { return *store_; }

  // Stops accepting calls, lets streams in flight finish within `grace`,
  // then cancels what is left. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  void Wait();

 private:
  RollpackServer() = default;

  std::string host_;
  int port_ = 0;
  std::unique_ptr<SampleStore> store_;
  std::unique_ptr<RolloutsService> rollouts_;
  std::unique_ptr<SchedulerService> scheduler_;
  std::unique_ptr<TrainerService> trainer_;
  std::unique_ptr<grpc::Server> server_;
  bool shut_down_ = false;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_SERVER_H_
