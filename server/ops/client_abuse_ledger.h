// What each client host may do to the HTTP/2 transport before rollpackd stops
// serving it (server/ops/h2_guard.h): connections at once, stream resets over
// time, and the cool-down of a host caught over its budget. Keyed by the
// client's IP, like --max-streams-per-client: its connections share one
// budget, so opening more connections buys an attacker nothing.
#ifndef ROLLPACK_SERVER_OPS_CLIENT_ABUSE_LEDGER_H_
#define ROLLPACK_SERVER_OPS_CLIENT_ABUSE_LEDGER_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rollpack {

struct ClientAbuseLimits {
  // Connections one client host may hold at once; 0 = no limit.
  int max_connections_per_client = 1024;
  // Stream resets (the client's RST_STREAM frames of streams the server has
  // not ended: server/ops/h2_open_streams.h) a client host may make at once;
  // the budget refills at reset_budget / 30 per second, and a host's debt is
  // at most one budget. 0 = no limit. The figures are those nghttp2 applies
  // per connection (1000 at once, 33 per second), here per host: a gRPC
  // client resets a stream only when it cancels a call.
  int64_t reset_budget = 1000;
  // How long a host caught over its budget is refused new connections.
  absl::Duration cooldown = absl::Seconds(10);
};

class ClientAbuseLedger {
 public:
  enum class Admission { kAdmitted, kCoolingDown, kTooManyConnections };

  explicit ClientAbuseLedger(ClientAbuseLimits limits) : limits_(limits) {}

  // A new connection of `client` at `now`; when admitted, the caller calls
  // ConnectionClosed(client) once it ends.
  Admission AdmitConnection(const std::string& client, absl::Time now);
  void ConnectionClosed(const std::string& client);

  // Spends `resets` of the client's budget; false when it ran out (the
  // client then cools down from `now`).
  bool SpendResets(const std::string& client, int64_t resets, absl::Time now);

  // Refuses new connections of `client` for the cool-down from `now`.
  void CoolDown(const std::string& client, absl::Time now);

  const ClientAbuseLimits& limits() const { return limits_; }

 private:
  struct Client {
    int connections = 0;
    double resets_left = 0;
    absl::Time refilled = absl::InfinitePast();
    absl::Time cooling_until = absl::InfinitePast();
  };

  // Drops clients with no connection whose budget is full again and whose
  // cool-down ended, so the table holds only hosts seen lately.
  void ForgetIdle(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Refill(Client& client, absl::Time now) const;

  const ClientAbuseLimits limits_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Client> clients_ ABSL_GUARDED_BY(mu_);
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_CLIENT_ABUSE_LEDGER_H_
