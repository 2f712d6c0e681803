// Rate-limited links between cluster members on one host, for
// `rollpack bench cluster --mode fetch --link-gbps`: member i runs in a
// network namespace of its own (rpb<pid>m<i>) behind a veth pair
// (rpb<pid>m<i>h on the host, rpb<pid>m<i>n inside; 10.A.i.1/30 and
// 10.A.i.2/30, A chosen so that no route of the host overlaps 10.A.0.0/16).
// Both ends are shaped by tc tbf, so each direction of each member's link
// carries at most the rate, as a NIC would; the host forwards between the
// namespaces (net.ipv4.ip_forward = 1 while the links exist), as a switch
// would, so member-to-member bytes cross two links like on a real network.
#ifndef ROLLPACK_CLI_BENCH_LINKS_H_
#define ROLLPACK_CLI_BENCH_LINKS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace rollpack {

class MemberLinks {
 public:
  // `members` namespaces with links of `gbytes_per_second` (bytes: 0.1 =
  // 100 MB/s = 800 Mbit/s) each way. FAILED_PRECONDITION naming the missing
  // capability when not root or `ip netns add` is refused; whatever was made
  // before a failure is removed again.
  static absl::StatusOr<std::unique_ptr<MemberLinks>> Create(int members,
                                                             double gbytes_per_second);

  // Removes the namespaces and veth pairs of benchmarks that are no longer
  // running (one killed with -9 could not remove its own).
  static void RemoveStale();

  // TearDown().
  ~MemberLinks();
  MemberLinks(const MemberLinks&) = delete;
  MemberLinks& operator=(const MemberLinks&) = delete;

  // Removes every namespace and veth pair made and restores ip_forward.
  // Idempotent and safe from any thread (the signal watcher calls it too).
  void TearDown();

  int members() const { return members_; }
  std::string netns(int i) const;
  // The namespace's end of member i's link: where it listens.
  std::string member_ip(int i) const;
  // The host's end: reachable from every namespace (etcd listens here).
  std::string host_ip(int i) const;

 private:
  MemberLinks(int members, int octet) : members_(members), octet_(octet) {}

  absl::Status SetUp(int i, double gbytes_per_second);

  const int members_;
  const int octet_;  // the A of 10.A.i.x
  absl::Mutex mu_;
  bool torn_down_ ABSL_GUARDED_BY(mu_) = false;
  // ip_forward as found; empty when it was not changed.
  std::string old_ip_forward_ ABSL_GUARDED_BY(mu_);
  int cleanup_id_ = -1;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_LINKS_H_
