// Trainer streams in flight per client host (--max-streams-per-client), so
// one client holding streams it never reads cannot take every slot of
// --max-concurrent-streams from the real trainers.
#ifndef ROLLPACK_SERVER_DELIVERY_CLIENT_STREAM_QUOTA_H_
#define ROLLPACK_SERVER_DELIVERY_CLIENT_STREAM_QUOTA_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace rollpack {

// gRPC's peer string without its port: "ipv4:10.0.0.7:51234" ->
// "ipv4:10.0.0.7", "ipv6:[::1]:5" -> "ipv6:[::1]" (a client's connections
// share it; a Unix socket's peer is kept whole).
std::string PeerHost(absl::string_view peer);

class ClientStreamQuota {
 public:
  // 0 = no limit.
  explicit ClientStreamQuota(int max_per_client) : max_per_client_(max_per_client) {}

  // Takes a slot for `client`; false (nothing taken) when it holds them all.
  bool Acquire(const std::string& client);
  void Release(const std::string& client);

  int max_per_client() const { return max_per_client_; }
  int InFlight(const std::string& client) const;

 private:
  const int max_per_client_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_DELIVERY_CLIENT_STREAM_QUOTA_H_
