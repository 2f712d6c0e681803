#include "server/delivery/client_stream_quota.h"

#include "absl/strings/match.h"

namespace rollpack {

std::string PeerHost(absl::string_view peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) {
    return std::string(peer);
  }
  const size_t colon = peer.rfind(':');
  // "ipv4:" alone has its only colon at the scheme: nothing to strip.
  if (colon == absl::string_view::npos || colon < 5) return std::string(peer);
  return std::string(peer.substr(0, colon));
}

bool ClientStreamQuota::Acquire(const std::string& client) {
  absl::MutexLock lock(&mu_);
  int& n = in_flight_[client];
  if (max_per_client_ > 0 && n >= max_per_client_) {
    if (n == 0) in_flight_.erase(client);
    return false;
  }
  ++n;
  return true;
}

void ClientStreamQuota::Release(const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(client);
  if (it == in_flight_.end()) return;
  // Entries go with their last stream: the map holds only clients with one.
  if (--it->second <= 0) in_flight_.erase(it);
}

int ClientStreamQuota::InFlight(const std::string& client) const {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(client);
  return it == in_flight_.end() ? 0 : it->second;
}

}  // namespace rollpack
