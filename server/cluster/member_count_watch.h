// --cluster-expect-members N (docs/cluster.md): a warning every period while
// fewer than N members are live, for members that failed to start or joined
// under another --cluster-name. Reads the keep-alive thread's last count (no
// etcd call).
#ifndef ROLLPACK_SERVER_CLUSTER_MEMBER_COUNT_WATCH_H_
#define ROLLPACK_SERVER_CLUSTER_MEMBER_COUNT_WATCH_H_

#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rollpack {

class Cluster;

// The warning for `live` members of cluster `name` when `expected` are
// expected; nullopt when there are enough.
std::optional<std::string> MemberCountWarning(int live, int expected, const std::string& name);

class MemberCountWatch {
 public:
  // Checks `cluster` (not owned; outlives the watch) every `period`.
  MemberCountWatch(Cluster* cluster, int expected, absl::Duration period = absl::Minutes(1));
  // Stops and joins the thread.
  ~MemberCountWatch();
  MemberCountWatch(const MemberCountWatch&) = delete;
  MemberCountWatch& operator=(const MemberCountWatch&) = delete;

 private:
  void Loop();

  Cluster* const cluster_;
  const int expected_;
  const absl::Duration period_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_MEMBER_COUNT_WATCH_H_
