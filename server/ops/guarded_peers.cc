#include "server/ops/guarded_peers.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"

namespace rollpack {
namespace {

// Process-wide, as socket numbers are. Bounded by the number of open files.
struct GuardedPeerTable {
  absl::Mutex mu;
  absl::flat_hash_map<int, std::string> by_fd ABSL_GUARDED_BY(mu);
};

GuardedPeerTable& Table() {
  static GuardedPeerTable* const table = new GuardedPeerTable;
  return *table;
}

}  // namespace

void RecordGuardedPeer(int fd, std::string address) {
  GuardedPeerTable& table = Table();
  absl::MutexLock lock(&table.mu);
  table.by_fd[fd] = std::move(address);
}

std::string CallPeer(absl::string_view grpc_peer) {
  absl::string_view number = grpc_peer;
  int fd = 0;
  if (!absl::ConsumePrefix(&number, "fd:") || !absl::SimpleAtoi(number, &fd)) {
    return std::string(grpc_peer);
  }
  GuardedPeerTable& table = Table();
  absl::MutexLock lock(&table.mu);
  auto it = table.by_fd.find(fd);
  if (it == table.by_fd.end()) return absl::StrCat("fd:", fd);
  return it->second;
}

}  // namespace rollpack
