// Rendezvous: a small in-memory key -> bytes board (rendezvous.proto) that
// lets trainer ranks exchange e.g. an NCCL unique id through rollpackd.
// Waiting calls do not hold a gRPC thread: they are parked and completed by
// a post of their key, or by a reaper thread at their deadline or on cancel.
#ifndef ROLLPACK_SERVER_CONTROL_RENDEZVOUS_SERVICE_H_
#define ROLLPACK_SERVER_CONTROL_RENDEZVOUS_SERVICE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rollpack/v1/rendezvous.grpc.pb.h"
#include "server/ops/auth.h"

namespace rollpack {

struct RendezvousOptions {
  size_t max_keys = 4096;
  absl::Duration ttl = absl::Hours(1);
  absl::Duration default_wait = absl::Seconds(60);
  absl::Duration max_wait = absl::Seconds(600);
  size_t max_key_bytes = 512;
  size_t max_value_bytes = 64 << 10;
};

class RendezvousService final : public v1::Rendezvous::CallbackService {
 public:
  explicit RendezvousService(RendezvousOptions options = {});
  // Completes parked calls with CANCELLED and joins the reaper.
  ~RendezvousService() override;

  grpc::ServerUnaryReactor* ExchangeId(grpc::CallbackServerContext* context,
                                       const v1::ExchangeIdRequest* request,
                                       v1::ExchangeIdResponse* response) override;

  // Token auth (server/ops/auth.h); null = off. Set before serving.
  void set_authorizer(const Authorizer* auth) { auth_ = auth; }

 private:
  struct Entry {
    std::string value;
    absl::Time expires;
  };
  struct Waiter {
    grpc::CallbackServerContext* context;
    grpc::ServerUnaryReactor* reactor;
    v1::ExchangeIdResponse* response;
    std::string key;
    absl::Time deadline;
  };

  void Reap();
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RendezvousOptions options_;
  const Authorizer* auth_ = nullptr;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // insertion order, for eviction
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CONTROL_RENDEZVOUS_SERVICE_H_
