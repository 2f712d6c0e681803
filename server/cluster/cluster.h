// Cluster mode (docs/cluster.md): this rollpackd as one member of a set that
// behaves as one service. Membership is an etcd lease: the member's key
// (/<cluster>/members/<id>) lives while the member keeps its lease alive,
// so a member that stops (or is killed) leaves within the lease's TTL and
// one that starts joins without a restart of the others. Facts that hold
// for the whole cluster (a pool's model) are etcd keys created atomically.
// Sample bytes never go through etcd.
#ifndef ROLLPACK_SERVER_CLUSTER_CLUSTER_H_
#define ROLLPACK_SERVER_CLUSTER_CLUSTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"
#include "rollpack/v1/member.grpc.pb.h"
#include "rollpack/v1/rollouts.grpc.pb.h"
#include "rollpack/v1/rollouts.pb.h"
#include "scheduler/model_spec.h"
#include "server/cluster/etcd_client.h"
#include "server/cluster/key_value_store.h"
#include "server/cluster/member_health.h"
#include "server/cluster/pool_facts.h"
#include "server/store/sample_store.h"

namespace rollpack {

struct ClusterOptions {
  EtcdOptions etcd;
  // Key prefix: several clusters can share one etcd.
  std::string name = "rollpack";
  // host:port other members and trainers reach this member at; also its id.
  std::string advertise;
  // This process's incarnation (incarnation.h): new whenever the member
  // starts without its data. Steps record it with the samples held here.
  std::string incarnation;
  // Membership lease: a member that stops renewing leaves after this long.
  absl::Duration lease_ttl = absl::Seconds(5);
  // The lease of the member's roster entry (/<cluster>/roster/<id>), which
  // tells the others, after an etcd outage that revoked the membership
  // leases, who had joined before it (Members()). At least ten lease TTLs;
  // renewed every tenth of it, so an outage shorter than nine tenths of it
  // leaves the roster whole.
  absl::Duration roster_ttl = absl::Minutes(10);
  // How this member dials the others: mutual TLS with its member
  // certificate when the cluster runs with credentials (docs/cluster.md,
  // "Threat model"); null = plaintext.
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials;
  // The largest message taken from a peer: a ReadSamples batch is 4 MiB of
  // samples plus at most one sample, which came in one request of at most
  // the server's --max-message-bytes.
  int64_t peer_max_receive_bytes = (int64_t{512} << 20) + (int64_t{5} << 20);
};

struct ClusterMember {
  std::string id;
  std::string address;
};

class Cluster {
 public:
  // Registers this member (a lease and its key) and keeps the lease alive
  // on a thread of its own, re-joining when etcd lost it (etcd was away
  // longer than the TTL). UNAVAILABLE when etcd cannot be reached.
  static absl::StatusOr<std::unique_ptr<Cluster>> Join(const ClusterOptions& options);
  // The same over `store` in place of an etcd client of options.etcd (the
  // cluster's unit tests: testing/in_memory_key_value_store.h).
  static absl::StatusOr<std::unique_ptr<Cluster>> Join(const ClusterOptions& options,
                                                       std::unique_ptr<KeyValueStore> store);
  // Leaves: revokes the lease, so the others see this member go at once.
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const ClusterMember& self() const { return self_; }
  const ClusterOptions& options() const { return options_; }

  // The live members, this one included, in id order. Right after etcd
  // gave trouble (away, slow, or back from away, when it revokes the leases
  // that ran out meanwhile: EtcdClient::last_trouble) or while this
  // member's own key is missing, every member that had joined before is
  // waited for while etcd does not list it (it joins again within moments),
  // until the lease TTL and a second after the trouble (and at most that
  // long per call), instead of being counted out: the cluster's view
  // (GetPool, CreateStep's selection) is whole from etcd's first answer on.
  // "Had joined": in the last list settled here, or with a roster entry
  // written after that list was read (a member that joined or joined again
  // since; the roster's leases outlive the membership leases).
  absl::StatusOr<std::vector<ClusterMember>> Members();
  // Members last seen by the keep-alive thread (for metrics; no etcd call).
  int last_member_count() const;
  // Every member that had joined and was not lost as the keep-alive thread
  // last saw the list (member_health.h; no etcd call): while etcd is
  // unreachable, the view this member had before, in id order.
  std::vector<ClusterMember> LastMembers() const;
  // Every member that had joined, as the keep-alive thread last saw the
  // list: true while etcd lists it, false once it is lost (member_health.h).
  std::map<std::string, bool> MemberUp() const;
  // Whether etcd answers this member now (KeyValueStore::reachable), and
  // since when it does not.
  bool etcd_reachable() const { return etcd_->reachable(); }
  const EtcdReachability& etcd_reachability() const { return etcd_->reachability(); }
  // KeyValueStore::SetReachabilityListener.
  void SetEtcdListener(std::function<void(bool reachable)> listener) {
    etcd_->SetReachabilityListener(std::move(listener));
  }
  // UNAVAILABLE naming etcd's endpoints, how long they have not answered
  // and etcd's last error: `what` waits for etcd.
  absl::Status EtcdAway(absl::string_view what) const;

  // Pool facts (cluster_pools.cc). While etcd is unreachable, or when a
  // call to it fails UNAVAILABLE, each answers what this member read from
  // or wrote to etcd before (pool_facts.h), or UNAVAILABLE naming etcd and
  // the pool when it knows nothing of it.
  //
  // Fixes `model` as pool `pool`'s model for the whole cluster unless the
  // pool exists; returns the cluster's model for the pool (`model`, or the
  // one registered first, which the caller compares) and sets *created.
  absl::StatusOr<ModelSpec> RegisterPool(const std::string& pool, const ModelSpec& model,
                                         bool* created);
  // The pool's cluster-wide model, or nullopt when no member registered it.
  absl::StatusOr<std::optional<ModelSpec>> LookupPool(const std::string& pool);
  // Every pool registered on some member, sorted (needs etcd).
  absl::StatusOr<std::vector<std::string>> PoolNames();
  // Reads the pool's schema, when one is fixed, into what this member knows
  // (for its first batch of the pool while etcd is away).
  absl::Status LearnSchema(const std::string& pool);
  // What this member knows of a pool it took from its durable log (its
  // facts were fixed in etcd when it took the pool first).
  void RememberPool(const std::string& pool, const ModelSpec& model, const PoolOptions& options);
  // etcd holds the pool no more (deleted): what this member knew goes.
  void ForgetPool(const std::string& pool) { pool_facts_.Forget(pool); }
  // Fixes the pool's lifecycle options for the whole cluster unless they
  // are fixed; returns the options that hold.
  absl::StatusOr<PoolOptions> FixPoolOptions(const std::string& pool, const PoolOptions& options);
  // The pool's cluster-wide options (the defaults when none were fixed).
  absl::StatusOr<PoolOptions> LookupPoolOptions(const std::string& pool);

  // Fixes the pool's token-field schema for the whole cluster unless one is
  // fixed; returns the schema that holds (PoolDirectory::FixSchema).
  absl::StatusOr<std::map<std::string, FieldSchema>> FixSchema(
      const std::string& pool, const std::map<std::string, FieldSchema>& proposed);

  // etcd keys of this cluster: /<name>/<kind>/<rest>.
  std::string Key(absl::string_view kind, absl::string_view rest) const;
  KeyValueStore* etcd() { return etcd_.get(); }
  // The Member service (member.proto) of `member`, over its kept channel.
  v1::Member::Stub* MemberStub(const ClusterMember& member);
  // The Rollouts service of `member` (its local_only calls), likewise.
  v1::Rollouts::Stub* RolloutsStub(const ClusterMember& member);

  // GetPool of `member` alone (GetPoolRequest.local_only), over a channel
  // kept per member; with `complete_group_ids`, which of them it holds
  // complete (group_census.h). UNAVAILABLE naming the member when it does
  // not answer.
  absl::StatusOr<v1::PoolInfo> GetPoolOf(const ClusterMember& member, const std::string& pool,
                                         const std::vector<std::string>& complete_group_ids = {});
  // Maintenance (docs/cluster.md, "Maintenance: draining a member"; in
  // cluster_drain.cc). A drain is the key /<cluster>/drained/<id>, without a
  // lease so that it outlives the member's restarts: the id, then a line
  // saying when and through which member. Drain: NOT_FOUND unless `member`
  // is live; undrain: NOT_FOUND when it is neither live nor drained.
  absl::Status SetDrained(const std::string& member, bool drained);
  // The ids with a drain key; *revision: the etcd revision read at. A key
  // that does not hold its own id is ignored (warned about once), as a
  // member key would be.
  absl::StatusOr<std::set<std::string>> DrainedMembers(int64_t* revision = nullptr);
  // Reads this member's drain key again and applies it (logged when it
  // changes): at the join, every renewal, and when DrainMember reaches it.
  absl::Status RefreshSelfDrained();
  // Whether this member is drained, as last read (no etcd call).
  bool self_drained() const { return self_drained_.load(); }
  // UNAVAILABLE naming this member while it is drained: what PutSamples and
  // the capture port answer a new sample (producers retry elsewhere).
  absl::Status AcceptsNewSamples() const;

  // SetPolicyVersion of `member` alone (local_only); errors as GetPoolOf.
  absl::StatusOr<v1::PoolInfo> SetPolicyVersionOf(const ClusterMember& member,
                                                  const std::string& pool,
                                                  int64_t policy_version);

 private:
  explicit Cluster(ClusterOptions options, std::unique_ptr<KeyValueStore> etcd);
  absl::Status Register();
  // Puts this member's key back when it is not its registration on `lease`.
  absl::Status Reassert(int64_t lease);
  // Puts this member's roster entry when its member key was (re)written
  // since, on a roster lease granted when there is none (or it ran out);
  // renews that lease every tenth of its TTL. Join and keep-alive thread.
  absl::Status KeepRoster();
  void KeepAliveLoop();
  // The keep-alive thread's view of etcd's list `listed`: logs members
  // joining, leaving and lost (cluster_member_watch.cc).
  void WatchMembers(const std::vector<ClusterMember>& listed);
  // The member keys etcd holds now, as Members() counts them, without
  // waiting for any; *revision: the etcd revision they were read at.
  absl::StatusOr<std::vector<ClusterMember>> ListMembers(int64_t* revision = nullptr);
  // The roster: each member's id and the revision its entry was written at.
  absl::StatusOr<std::map<std::string, int64_t>> Roster();
  // `members`, read at `revision`, as the settled list, unless a later
  // list is settled already.
  void Settle(std::vector<ClusterMember> members, int64_t revision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a member missing from etcd's list may be one whose lease etcd
  // revoked while it was away: until `trouble + rejoin window`.
  absl::Time RejoinDeadline() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RenewDue() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || renew_now_; }
  std::string MemberKey(const std::string& id) const;
  std::string RosterKey(const std::string& id) const;
  std::string PoolKey(const std::string& pool) const;
  std::string SchemaKey(const std::string& pool) const;
  // Whether a drain key's value is `member`'s (warns once per key if not).
  bool ValidDrainValue(const std::string& key, const std::string& member,
                       const std::string& value);

  const ClusterOptions options_;
  const ClusterMember self_;
  const std::string registration_;  // the value of this member's key
  std::unique_ptr<KeyValueStore> etcd_;

  mutable absl::Mutex mu_;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int last_member_count_ ABSL_GUARDED_BY(mu_) = 0;
  // The members etcd listed when nothing was amiss (Members()), and the
  // etcd revision of that list.
  std::vector<ClusterMember> settled_ ABSL_GUARDED_BY(mu_);
  int64_t settled_revision_ ABSL_GUARDED_BY(mu_) = 0;
  // This member's roster lease (0: none yet); whether its roster entry is
  // to be put (its member key was written since), and when the lease was
  // last renewed (Join, then the keep-alive thread alone).
  int64_t roster_lease_ ABSL_GUARDED_BY(mu_) = 0;
  bool roster_due_ = true;
  absl::Time roster_renewed_ = absl::InfinitePast();
  // When this member last found its own lease gone or its key missing.
  absl::Time own_key_lost_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Set to have the keep-alive thread renew (and re-register) now.
  bool renew_now_ ABSL_GUARDED_BY(mu_) = false;
  // Member keys Members() ignored (warned about once each).
  std::set<std::string> ignored_keys_ ABSL_GUARDED_BY(mu_);
  std::thread keep_alive_;
  // WatchMembers' state: the keep-alive thread writes, metrics read.
  mutable absl::Mutex health_mu_;
  MemberHealth member_health_ ABSL_GUARDED_BY(health_mu_);
  absl::Time roster_checked_ ABSL_GUARDED_BY(health_mu_) = absl::InfinitePast();
  PoolFacts pool_facts_;
  std::atomic<bool> self_drained_{false};

  class Peers;
  std::unique_ptr<Peers> peers_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_CLUSTER_H_
