#include "server/ops/client_abuse_ledger.h"

#include <algorithm>

namespace rollpack {
namespace {

// The budget refills whole in this time.
constexpr double kRefillSeconds = 30.0;

}  // namespace

void ClientAbuseLedger::Refill(Client& client, absl::Time now) const {
  const double budget = static_cast<double>(limits_.reset_budget);
  if (client.refilled == absl::InfinitePast()) {
    client.resets_left = budget;
  } else if (now > client.refilled) {
    const double seconds = absl::ToDoubleSeconds(now - client.refilled);
    client.resets_left = std::min(budget, client.resets_left + seconds * budget / kRefillSeconds);
  }
  client.refilled = std::max(client.refilled, now);
}

ClientAbuseLedger::Admission ClientAbuseLedger::AdmitConnection(const std::string& client,
                                                                 absl::Time now) {
  absl::MutexLock lock(&mu_);
  ForgetIdle(now);
  Client& c = clients_[client];
  if (now < c.cooling_until) return Admission::kCoolingDown;
  if (limits_.max_connections_per_client > 0 &&
      c.connections >= limits_.max_connections_per_client) {
    return Admission::kTooManyConnections;
  }
  ++c.connections;
  return Admission::kAdmitted;
}

void ClientAbuseLedger::ConnectionClosed(const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client);
  if (it != clients_.end() && it->second.connections > 0) --it->second.connections;
}

bool ClientAbuseLedger::SpendResets(const std::string& client, int64_t resets, absl::Time now) {
  if (limits_.reset_budget <= 0 || resets <= 0) return true;
  absl::MutexLock lock(&mu_);
  Client& c = clients_[client];
  Refill(c, now);
  // The debt is bounded: a host that flooded is clean again a minute after
  // it stopped, however much one read held.
  c.resets_left = std::max(c.resets_left - static_cast<double>(resets),
                           -static_cast<double>(limits_.reset_budget));
  if (c.resets_left >= 0) return true;
  c.cooling_until = now + limits_.cooldown;
  return false;
}

void ClientAbuseLedger::CoolDown(const std::string& client, absl::Time now) {
  absl::MutexLock lock(&mu_);
  clients_[client].cooling_until = now + limits_.cooldown;
}

void ClientAbuseLedger::ForgetIdle(absl::Time now) {
  // Swept at most once a second: admission stays O(1) amortized.
  if (now - last_sweep_ < absl::Seconds(1)) return;
  last_sweep_ = now;
  absl::erase_if(clients_, [&](auto& entry) {
    Client& c = entry.second;
    if (c.connections > 0 || now < c.cooling_until) return false;
    if (limits_.reset_budget > 0) {
      Refill(c, now);
      if (c.resets_left < static_cast<double>(limits_.reset_budget)) return false;
    }
    return true;
  });
}

}  // namespace rollpack
