// The key-value store the cluster coordinates through (docs/cluster.md):
// every etcd call of server/cluster goes through this interface. EtcdClient
// (etcd_client.h) is the real one; testing/in_memory_key_value_store.h is a
// fake with the same rules, so that the cluster's rules (membership, the
// hold/commit protocol of steps, releases, stale holds) are tested without
// an etcd. Modelled on etcd's own Go client (clientv3.KV, clientv3.Lease),
// but only the operations the cluster makes: each method is one etcd request
// (Range, Put, DeleteRange, Txn, LeaseGrant, LeaseKeepAlive, LeaseRevoke),
// named by what it does. The cluster polls; it watches no key, so there is
// no Watch here.
//
// The rules the cluster relies on, which every implementation keeps:
//  - One revision counter for the whole store, strictly increasing: each
//    request that changes keys (a Put, a DeleteRange that deleted a key, a
//    Txn that wrote, a lease revoked or run out with keys on it) commits at
//    the next revision, and everything it changed carries that revision. A
//    read or a Txn that wrote nothing commits none.
//  - A key's create revision is the revision that created it (0: absent); a
//    key deleted and created again has a new one. Its mod revision is that
//    of its last change. Two values of a key never share a mod revision.
//  - Reads are linearizable: a read sees every write that completed before
//    it began, on any member. A listing is one snapshot at one revision.
//  - A transaction (CreateIfAbsent, ReplaceIfUnchanged, DeleteAll) is
//    atomic: of two racing CreateIfAbsent, exactly one creates and both see
//    its value.
//  - A lease expires `ttl` after its last keep-alive; its keys are deleted
//    with it, at one revision. A Put on a lease that is gone fails.
//  - Failures: UNAVAILABLE when the store does not answer (after retries
//    within the implementation's budget) or refuses for a reason no retry of
//    the same call fixes here (an unknown lease); RESOURCE_EXHAUSTED for a
//    request over the store's size limit. A failed write may have been
//    applied: every write here is idempotent or checked by its caller.
#ifndef ROLLPACK_SERVER_CLUSTER_KEY_VALUE_STORE_H_
#define ROLLPACK_SERVER_CLUSTER_KEY_VALUE_STORE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/cluster/etcd_reachability.h"

namespace rollpack {

// One key as the store holds it.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t lease = 0;  // 0: none, the key lives until deleted
  int64_t mod_revision = 0;
};

// A key's revisions (both 0: the key does not exist).
struct KeyRevisions {
  int64_t create = 0;
  int64_t mod = 0;
};

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Reads (etcd Range).
  //
  // `key` with its lease and mod revision, or nullopt when it does not exist.
  virtual absl::StatusOr<std::optional<EtcdKeyValue>> GetEntry(const std::string& key) = 0;
  // `key`'s revisions, without reading its value.
  virtual absl::StatusOr<KeyRevisions> Revisions(const std::string& key) = 0;
  // Every key starting with `prefix`, in key order, with its value, lease
  // and mod revision; *revision, when given, is set to the store revision
  // the snapshot was read at.
  virtual absl::StatusOr<std::vector<EtcdKeyValue>> ListPrefix(const std::string& prefix,
                                                               int64_t* revision = nullptr) = 0;
  // The keys starting with `prefix` and their mod revisions, in key order,
  // without their values (what changed since a listing is read alone).
  virtual absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> ListPrefixKeys(
      const std::string& prefix) = 0;

  // Writes (etcd Put, DeleteRange, Txn). lease 0 = none.
  virtual absl::Status Put(const std::string& key, const std::string& value,
                           int64_t lease = 0) = 0;
  // Puts `key` = `value` only if the key is still at `mod_revision` (what a
  // GetEntry saw; 0: absent); false when another writer changed it
  // meanwhile. A Txn comparing the key's mod revision.
  virtual absl::StatusOr<bool> ReplaceIfUnchanged(const std::string& key, int64_t mod_revision,
                                                  const std::string& value,
                                                  int64_t lease = 0) = 0;
  // Creates `key` = `value` unless the key exists, atomically; returns the
  // value the key holds afterwards (`value`, or what another writer put
  // first) and sets *created. Two racing creators: exactly one wins, both
  // see its value. `mod_revision`, when given, is set to the mod revision of
  // the value returned. A Txn comparing the key's create revision with 0,
  // reading the key when it fails; ABORTED when the key was deleted between
  // the two (retry).
  virtual absl::StatusOr<std::string> CreateIfAbsent(const std::string& key,
                                                     const std::string& value, bool* created,
                                                     int64_t lease = 0,
                                                     int64_t* mod_revision = nullptr) = 0;
  // Deleting a key that does not exist is no error.
  virtual absl::Status Delete(const std::string& key) = 0;
  // Deletes every key of `keys` in one transaction (all or none); returns
  // how many existed.
  virtual absl::StatusOr<int64_t> DeleteAll(const std::vector<std::string>& keys) = 0;

  // Leases (etcd Lease).
  //
  // A lease that expires `ttl` (whole seconds, at least one) after its last
  // keep-alive; returns its id, never 0.
  virtual absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) = 0;
  // Renews the lease; NOT_FOUND when it has expired (the store forgot it and
  // every key attached to it): the event a member's loss of its membership
  // is seen by.
  virtual absl::Status KeepAlive(int64_t lease) = 0;
  // Ends the lease now, deleting its keys.
  virtual absl::Status RevokeLease(int64_t lease) = 0;

  // The connection.
  //
  // Leaving: from now on every call is one attempt of at most `deadline`,
  // not retried, so that a member whose store is gone stops within seconds
  // (its leases run out on their own).
  virtual void StopRetrying(absl::Duration deadline = absl::Seconds(1)) = 0;
  // Where the store is, for messages ("http://10.0.0.1:2379").
  virtual const std::string& endpoints() const = 0;
  // When the store last gave trouble: a call that failed or was slow, or the
  // first answer after failed ones (the end of an outage, when leases that
  // ran out meanwhile are revoked). InfinitePast when never.
  virtual absl::Time last_trouble() const = 0;
  // Whether the store answers this member (etcd_reachability.h), from every
  // call's outcome.
  virtual const EtcdReachability& reachability() const = 0;
  // Called with the new state after each change of reachability(), on the
  // thread whose call saw it, outside any lock of the store. Replaces the
  // previous one; nullptr: none.
  virtual void SetReachabilityListener(std::function<void(bool reachable)> listener) = 0;
  // One read of no key with `deadline`, no retries: whether the store
  // answers now (reachability() follows it).
  virtual bool Probe(absl::Duration deadline) const = 0;

  // Derived from the above, the same for every store.
  //
  // The value of `key`, or nullopt when it does not exist.
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key);
  // The revision that created `key` (it tells a key from one deleted and
  // created again), 0 when it does not exist.
  absl::StatusOr<int64_t> CreateRevision(const std::string& key);
  // The revision of `key`'s last change (it tells a value from any other
  // the key held), 0 when it does not exist.
  absl::StatusOr<int64_t> ModRevision(const std::string& key);
  // Every key starting with `prefix` and its value, in key order.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> GetPrefix(
      const std::string& prefix);
  bool reachable() const { return reachability().reachable(); }
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_KEY_VALUE_STORE_H_
