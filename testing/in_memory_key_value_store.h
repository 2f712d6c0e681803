// An etcd in memory for the cluster's unit tests: one InMemoryEtcd holds the
// keys, revisions and leases, and each NewClient() is a KeyValueStore
// (server/cluster/key_value_store.h) over it, as each member's EtcdClient is
// over one etcd, so that several members of a test share one store. It
// keeps the interface's rules (revisions, transactions, leases) as etcd
// does for the requests the cluster makes; key_value_store_conformance_test
// runs the same checks against it and a real etcd.
//
// What etcd does on its own, a test does here by hand: time passes by the
// clock given (leases run out by it, at the next call that looks), a lease
// runs out now with ExpireLease, and etcd goes away with StartOutage (every
// call of every client fails UNAVAILABLE, as EtcdClient's do once their
// retries are spent, and each client's reachability follows).
#ifndef ROLLPACK_TESTING_IN_MEMORY_KEY_VALUE_STORE_H_
#define ROLLPACK_TESTING_IN_MEMORY_KEY_VALUE_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/cluster/key_value_store.h"

namespace rollpack {

class InMemoryEtcd : public std::enable_shared_from_this<InMemoryEtcd> {
 public:
  // `clock`: what leases run out by (absl::Now when null).
  static std::shared_ptr<InMemoryEtcd> Create(std::function<absl::Time()> clock = nullptr);

  // A client of this etcd. Its reachability counts etcd unreachable once
  // its calls have failed for `grace` (EtcdClient's per-attempt deadline;
  // 0: at the first failed call).
  std::unique_ptr<KeyValueStore> NewClient(absl::Duration grace = absl::ZeroDuration());

  // etcd goes away for `duration` by the clock (InfiniteDuration: until
  // EndOutage): every call fails UNAVAILABLE and nothing changes, except
  // that leases keep running out, as they do in a real etcd whose clients
  // cannot reach it (they are revoked when it answers again).
  void StartOutage(absl::Duration duration = absl::InfiniteDuration());
  void EndOutage();
  // The lease runs out now: it and its keys are gone, at one revision.
  // NOT_FOUND when there is no such lease.
  absl::Status ExpireLease(int64_t lease);

  // For tests' checks (no outage applies).
  int64_t revision() const;
  std::vector<int64_t> leases() const;  // live ones, in id order
  // Every call any client made (reads and writes), failed ones included.
  int64_t calls() const;

  // The requests, for the clients (in_memory_key_value_store.cc). Each
  // returns UNAVAILABLE during an outage, `what` naming the request.
  struct Entry {
    std::string value;
    int64_t lease = 0;
    int64_t create_revision = 0;
    int64_t mod_revision = 0;
    int64_t version = 0;
  };
  absl::StatusOr<std::optional<EtcdKeyValue>> GetEntry(const std::string& key);
  absl::StatusOr<KeyRevisions> Revisions(const std::string& key);
  absl::StatusOr<std::vector<EtcdKeyValue>> ListPrefix(const std::string& prefix,
                                                       int64_t* revision);
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease);
  absl::StatusOr<bool> ReplaceIfUnchanged(const std::string& key, int64_t mod_revision,
                                          const std::string& value, int64_t lease);
  absl::StatusOr<std::string> CreateIfAbsent(const std::string& key, const std::string& value,
                                             bool* created, int64_t lease,
                                             int64_t* mod_revision);
  absl::Status Delete(const std::string& key);
  absl::StatusOr<int64_t> DeleteAll(const std::vector<std::string>& keys);
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  absl::Status KeepAlive(int64_t lease);
  absl::Status RevokeLease(int64_t lease);
  absl::Time Now() const { return clock_(); }

 private:
  struct Lease {
    absl::Duration ttl;
    absl::Time expires;
    std::set<std::string> keys;
  };
  explicit InMemoryEtcd(std::function<absl::Time()> clock) : clock_(std::move(clock)) {}
  // Leases past their time go, with their keys (one revision per lease).
  void ExpireDue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE during an outage; counts the call.
  absl::Status Answer(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts at `revision` (the caller's new one); the lease must be live.
  void PutAt(const std::string& key, const std::string& value, int64_t lease, int64_t revision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether it existed.
  bool Remove(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLease(int64_t lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE, as EtcdClient maps etcd's "requested lease not found",
  // unless `lease` is 0 or live.
  absl::Status CheckLease(int64_t lease, const std::string& what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<absl::Time()> clock_;
  mutable absl::Mutex mu_;
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 1;  // etcd starts at 1
  std::map<std::string, Entry> keys_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  int64_t next_lease_ ABSL_GUARDED_BY(mu_) = 0x1000;
  absl::Time outage_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_IN_MEMORY_KEY_VALUE_STORE_H_
