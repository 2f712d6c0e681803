// A small client of etcd v3's gRPC API (KV, Lease), the cluster's store of
// membership and cluster-wide facts (docs/cluster.md): the KeyValueStore
// (key_value_store.h) of a cluster in production. Every call has a
// deadline and transient failures are retried within a total budget; an
// unreachable etcd is UNAVAILABLE naming the endpoints, a request past
// etcd's --max-request-bytes RESOURCE_EXHAUSTED naming the limit when etcd
// tells it.
#ifndef ROLLPACK_SERVER_CLUSTER_ETCD_CLIENT_H_
#define ROLLPACK_SERVER_CLUSTER_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "server/cluster/etcd_reachability.h"
#include "server/cluster/key_value_store.h"

namespace rollpack {

struct EtcdOptions {
  // Client URLs ("http://127.0.0.1:2379") or host:port; the channel fails
  // over between them.
  std::vector<std::string> endpoints;
  // Deadline of one attempt, and of a call with its retries: transient
  // failures (an endpoint gone, a leader election) are retried within it.
  absl::Duration timeout = absl::Seconds(3);
  absl::Duration total_timeout = absl::Seconds(8);
  // TLS to etcd (https:// endpoints): the CA that signed etcd's server
  // certificate, and this client's certificate and key, which etcd with
  // --client-cert-auth checks and, with auth enabled, takes the user name
  // from (its Common Name). PEM contents, not paths.
  std::string tls_ca = "";
  std::string tls_cert = "";
  std::string tls_key = "";
  // When set (https:// endpoints only), the channel's credentials in place
  // of ones made from the PEMs above: rollpackd's re-read their files
  // (server/ops/watched_tls.h).
  std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr;
};

class EtcdClient final : public KeyValueStore {
 public:
  // INVALID_ARGUMENT for no endpoint, https:// endpoints without a CA (or
  // mixed with http:// ones), or a certificate without its key. Connects
  // lazily: no call is made here.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(const EtcdOptions& options);

  // KeyValueStore, over etcd's KV and Lease services.
  absl::StatusOr<std::optional<EtcdKeyValue>> GetEntry(const std::string& key) override;
  // A keys-only read: the value is not sent.
  absl::StatusOr<KeyRevisions> Revisions(const std::string& key) override;
  absl::StatusOr<std::vector<EtcdKeyValue>> ListPrefix(const std::string& prefix,
                                                       int64_t* revision = nullptr) override;
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> ListPrefixKeys(
      const std::string& prefix) override;
  absl::Status Put(const std::string& key, const std::string& value,
                   int64_t lease = 0) override;
  absl::StatusOr<bool> ReplaceIfUnchanged(const std::string& key, int64_t mod_revision,
                                          const std::string& value, int64_t lease = 0) override;
  absl::StatusOr<std::string> CreateIfAbsent(const std::string& key, const std::string& value,
                                             bool* created, int64_t lease = 0,
                                             int64_t* mod_revision = nullptr) override;
  absl::Status Delete(const std::string& key) override;
  absl::StatusOr<int64_t> DeleteAll(const std::vector<std::string>& keys) override;
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) override;
  absl::Status KeepAlive(int64_t lease) override;
  absl::Status RevokeLease(int64_t lease) override;
  // Instead of spending each call's total budget.
  void StopRetrying(absl::Duration deadline = absl::Seconds(1)) override;

  const std::string& endpoints() const override { return endpoints_; }

  // When etcd last gave trouble: an attempt that failed or took over a
  // second, or the first answer after failed ones (the end of an outage,
  // when etcd revokes the leases that ran out meanwhile). InfinitePast
  // when never.
  absl::Time last_trouble() const override;

  // Whether etcd answers this member (etcd_reachability.h: unreachable once
  // no attempt has succeeded for one attempt's deadline). Each change is
  // logged once ("etcd unreachable ...", "etcd reachable again after ...").
  const EtcdReachability& reachability() const override { return reachability_; }
  // Called with the new state after each change, on the thread whose etcd
  // call saw it (outside any lock of this client). Replaces the previous one;
  // nullptr: none.
  void SetReachabilityListener(std::function<void(bool reachable)> listener) override;
  // One read of no key with `deadline`, no retries: whether etcd answers
  // now (what reachable() follows, updated by it). For callers that answer
  // differently while etcd is away, so as not to answer so a moment after it
  // returned, before another call has seen it.
  bool Probe(absl::Duration deadline) const override;

 private:
  EtcdClient(std::shared_ptr<grpc::Channel> channel, std::string endpoints,
             absl::Duration timeout, absl::Duration total_timeout);
  grpc::Status Call(const std::function<grpc::Status(grpc::ClientContext*)>& rpc) const;
  absl::Status Error(const grpc::Status& status, absl::string_view what) const;
  // Records an attempt that ran from `started` to `ended` (last_trouble,
  // reachability); returns whether etcd did not answer it.
  bool Record(absl::Time started, absl::Time ended, const grpc::Status& status) const;
  // Logs a change of reachability_ and tells the listener.
  void Announce(EtcdReachability::Change change) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  const std::string endpoints_;
  const absl::Duration timeout_;
  const absl::Duration total_timeout_;
  // last_trouble(), in Unix nanoseconds (0: never); whether the last
  // attempt failed.
  mutable std::atomic<int64_t> trouble_nanos_{0};
  mutable std::atomic<bool> failing_{false};
  // StopRetrying()'s deadline in nanoseconds; 0 while calls retry.
  std::atomic<int64_t> leaving_deadline_nanos_{0};
  mutable EtcdReachability reachability_;
  mutable absl::Mutex listener_mu_;
  std::function<void(bool)> listener_ ABSL_GUARDED_BY(listener_mu_);
};

// The end of the key range that holds every key starting with `prefix`
// (etcd's range_end convention: the prefix with its last byte incremented).
std::string PrefixRangeEnd(absl::string_view prefix);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_ETCD_CLIENT_H_
