// rollpackd's gRPC server: the rollpack services plus health and reflection,
// over one SampleStore. Used by the daemon, the CLI's embedded demo server
// and in-process tests.
#ifndef ROLLPACK_SERVER_SERVER_H_
#define ROLLPACK_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/periodic_thread.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "server/delivery/fetch_options.h"
#include "server/ingest/ingest_options.h"
#include "server/capture/capture_metrics.h"
#include "server/capture/capture_options.h"
#include "server/capture/capture_server.h"
#include "server/ops/h2_guard.h"
#include "server/ops/h2_guard_mode.h"
#include "server/store/durable_log.h"

namespace rollpack {

// The services and parts the server owns; their headers stay out of every
// tool that only starts a server.
class Authorizer;
class CallLog;
class Cluster;
class ClusterAdminService;
class ClusterPoolDirectory;
class ClusterSteps;
class EtcdHealth;
class MemberService;
class PoolDirectory;
class RendezvousService;
class RolloutsService;
class RoutingAgreementBook;
class SampleStore;
class SchedulerService;
class StepActivity;
class StepDirectory;
class ServerMetrics;
class TelemetryService;
class TrainerService;
namespace metrics {
class MetricsEndpoint;
class ScrapeRegistry;
}  // namespace metrics

// Whether `listen` ("host:port") is reachable from this host only
// (127.0.0.0/8, ::1, localhost).
bool IsLoopbackListen(const std::string& listen);

struct ServerOptions {
  // host:port; port 0 picks a free one (see RollpackServer::port()).
  std::string listen = "127.0.0.1:0";
  // Bytes of samples the store may hold; <= 0 means half the machine's RAM.
  int64_t max_memory_bytes = 0;
  // Largest gRPC message either way. One 32k-token sample of a 94-layer
  // top-8 model is 24 MB at uint8.
  int max_message_bytes = 512 << 20;
  // Integer gRPC channel arguments (name, value) set on the server after
  // rollpackd's own, e.g. {"grpc.http2.lookahead_bytes", 16 << 20}: tuning
  // for hosts unlike ours, measured with `rollpack bench transport
  // --server-arg --grpc-arg=...` (docs/performance.md).
  std::vector<std::pair<std::string, int>> grpc_int_args;
  // Durable mode (server/store/durable_log.h): when set, every acknowledged
  // mutation is logged under this directory and replayed at start.
  std::string data_dir;
  FsyncPolicy fsync = FsyncPolicy::kAlways;
  absl::Duration fsync_batch_interval = absl::Milliseconds(50);
  int64_t compact_min_dead_bytes = int64_t{64} << 20;

  // --- Operations (docs/operations.md) ---
  // host:port of the Prometheus endpoint (GET /metrics); empty = off.
  std::string metrics_listen;
  // HTTP basic auth on /metrics: user -> password; empty = none.
  std::vector<std::pair<std::string, std::string>> metrics_basic_auth;
  // TLS on the gRPC port: PEM certificate chain and private key files. With
  // tls_client_ca too, clients must present a certificate signed by it
  // (mutual TLS). All empty = plaintext.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // How often the TLS files (these, the cluster's etcd ones) are checked for
  // a replacement: rotation without a restart.
  absl::Duration tls_refresh = absl::Seconds(60);
  // `ROLE TOKEN` lines (server/ops/auth.h); empty = no auth.
  std::string auth_tokens_file;
  // Bytes one pool may hold; 0 = only max_memory_bytes applies.
  int64_t max_pool_memory_bytes = 0;
  // Pools the server may hold (0 = no limit): each has its own metric series.
  int64_t max_pools = 64;
  // Samples one step may take (0 = no limit): CreateStep refuses a larger
  // selection with RESOURCE_EXHAUSTED before planning it.
  int64_t max_samples_per_step = int64_t{1} << 20;
  // A live step with no open trainer stream and no stream started or ended
  // for this long (nor created) is released as abandoned, counted in
  // rollpack_steps_expired_total; zero = never (docs/operations.md).
  absl::Duration step_ttl = absl::ZeroDuration();
  // A client connection with no call for this long is closed (GOAWAY);
  // zero = never.
  absl::Duration max_connection_idle = absl::Minutes(15);
  // Bytes gRPC's transport may hold for all connections together (read
  // buffers, messages received and not yet handed over, messages queued to
  // send): a gRPC ResourceQuota. Under pressure gRPC shrinks flow-control
  // windows and read sizes, then cancels streams (RESOURCE_EXHAUSTED).
  // 0 = no quota; else at least max_message_bytes.
  int64_t transport_memory_bytes = int64_t{1} << 30;
  // Whether requests may arrive gzip/deflate-compressed. Off, such a call
  // is refused (UNIMPLEMENTED) from its headers, before gRPC inflates a
  // message: a 498 KB gzip request inflated to 1.25 GB before its refusal.
  bool accept_compressed_requests = false;
  // Whether a plaintext port is fronted by rollpackd's HTTP/2 guard
  // (server/ops/h2_guard.h): stream-reset budgets, connection limits per
  // client host and the token check that gRPC 1.51 lacks. kAuto: when the
  // port is reachable from other hosts (not a loopback address), or with
  // --auth-tokens on loopback too (ChooseH2Guard says why). A TLS port
  // without a client CA is fronted with the guard ending TLS; mutual-TLS
  // ports never are.
  H2GuardMode h2_guard = H2GuardMode::kAuto;
  H2GuardOptions h2_guard_options;
  // Delivery (server/delivery/trainer_service.h).
  FetchOptions fetch;
  // The HTTP capture port (shared/spec/capture.md); off when capture.listen
  // is empty.
  CaptureOptions capture;
  // Ingest (server/ingest/put_samples_reactor.h).
  IngestOptions ingest;

  // --- Cluster mode (docs/cluster.md) ---
  // etcd client URLs (--cluster-etcd); empty = a single server.
  std::vector<std::string> cluster_etcd;
  // host:port the other members reach this one at; empty = address().
  std::string cluster_advertise;
  std::string cluster_name = "rollpack";
  absl::Duration cluster_lease_ttl = absl::Seconds(5);
  // With mutual TLS (tls_cert, tls_key, tls_client_ca), a peer whose client
  // certificate has this Common Name is a member: the Member service answers
  // only such peers, and members dial each other with their own certificate.
  std::string cluster_member_identity = "rollpack-member";
  // TLS to etcd (https:// endpoints): PEM files of etcd's CA and of this
  // member's client certificate and key (etcd takes the user from its CN).
  std::string cluster_etcd_ca;
  std::string cluster_etcd_cert;
  std::string cluster_etcd_key;
};

// "NAME=VALUE" (rollpackd --grpc-arg) -> {NAME, VALUE}; INVALID_ARGUMENT
// naming the text when VALUE is not an int or NAME is empty.
absl::StatusOr<std::pair<std::string, int>> ParseGrpcIntArg(absl::string_view text);

// INVALID_ARGUMENT naming the flag and value: a listen address that is not
// HOST:PORT, negative memory limits, a non-positive message size.
absl::Status ValidateServerOptions(const ServerOptions& options);

// Half of physical memory: the default --max-memory.
int64_t DefaultMaxMemoryBytes();

// Plaintext, TLS or mutual TLS from the tls_* options, the files re-read
// every tls_refresh; INVALID_ARGUMENT for a missing or non-PEM file or a
// cert without a key.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerOptions& options);

class RollpackServer {
 public:
  // Binds and starts serving. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<RollpackServer>> Start(const ServerOptions& options);
  ~RollpackServer();

  int port() const { return port_; }
  // "127.0.0.1:PORT" style address clients can dial.
  std::string address() const;
  SampleStore& store() { return *store_; }
  // Null unless durable mode; what startup recovered from it.
  DurableLog* durable_log() { return log_.get(); }
  const RecoveryInfo& recovery() const { return recovery_; }
  // Port of the metrics endpoint, 0 when off.
  int metrics_port() const;
  // Port of the capture port, 0 when off.
  int capture_port() const { return capture_ != nullptr ? capture_->port() : 0; }
  metrics::ScrapeRegistry& metrics_registry() { return *registry_; }
  // Null unless cluster mode.
  Cluster* cluster() { return cluster_.get(); }
  ClusterSteps* cluster_steps() { return cluster_steps_; }

  // Stops accepting calls, lets streams in flight finish within `grace`,
  // then cancels what is left. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));

  // Re-reads --auth-tokens (rollpackd does on SIGHUP): calls from now on
  // are checked against the file's tokens. The old ones stay, and the error
  // names the file, when it does not parse; OK with nothing to do without
  // a token file. TLS files need no call: they are re-read by themselves.
  absl::Status ReloadTokens();
  void Wait();

 private:
  RollpackServer() = default;
  // --capture-model registered, then the capture port listening
  // (server/server_capture.cc).
  absl::Status StartCapture(const CaptureOptions& options);
  // grpc.health: every rollpack service SERVING, except in cluster mode the
  // Scheduler until this member has joined (server/server_health.cc).
  void SetServiceHealth(bool cluster_mode);
  // Cluster mode, once joined: the cluster's metrics, the Scheduler's health
  // following etcd, and the pools this member took from its durable log
  // known without etcd (server/server_health.cc).
  void ReportCluster();
  // Cluster mode (server/server_cluster_steps.cc): attaches the cluster's
  // steps, with the counts GetPool and the metrics report and the lost
  // samples counter; --step-ttl over every member's streams.
  void AttachClusterSteps(Cluster* cluster);
  void StartClusterStepExpiry(absl::Duration ttl);

  std::string host_;
  int port_ = 0;
  // Declared before the store: destroyed after it.
  std::unique_ptr<DurableLog> log_;
  RecoveryInfo recovery_;
  std::unique_ptr<SampleStore> store_;
  std::shared_ptr<metrics::ScrapeRegistry> registry_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<metrics::MetricsEndpoint> exporter_;
  std::unique_ptr<Authorizer> auth_;
  std::string auth_tokens_file_;
  // After auth_: its interceptors name the caller's role through it.
  std::unique_ptr<CallLog> call_log_;
  // Where pools are defined and answered for: the store's own, or the
  // cluster's (then cluster_pools_ too). Before the services: outlives them.
  std::unique_ptr<PoolDirectory> pools_;
  ClusterPoolDirectory* cluster_pools_ = nullptr;
  std::unique_ptr<RolloutsService> rollouts_;
  // Where steps live: the store's own, or the cluster's (then cluster_steps_
  // too, and the Member service other members call).
  std::unique_ptr<StepDirectory> steps_;
  ClusterSteps* cluster_steps_ = nullptr;
  // Streams per step, for ListSteps and the step TTL.
  std::unique_ptr<StepActivity> step_activity_;
  std::unique_ptr<MemberService> member_;
  std::unique_ptr<SchedulerService> scheduler_;
  std::unique_ptr<TrainerService> trainer_;
  std::unique_ptr<RendezvousService> rendezvous_;
  std::unique_ptr<RoutingAgreementBook> routing_agreement_;
  std::unique_ptr<TelemetryService> telemetry_;
  // Cluster status and draining (a single server: its own status).
  std::unique_ptr<ClusterAdminService> cluster_admin_;
  std::unique_ptr<grpc::Server> server_;
  // After server_: stops relaying before gRPC goes.
  std::unique_ptr<H2Guard> h2_guard_;
  std::unique_ptr<CaptureMetrics> capture_metrics_;
  std::unique_ptr<CaptureServer> capture_;
  // Joined once the port is known; leaves (revokes its lease) at shutdown,
  // after the calls in flight that may use it.
  std::unique_ptr<Cluster> cluster_;
  // The Scheduler's health following etcd; after cluster_: goes first.
  std::unique_ptr<EtcdHealth> etcd_health_;
  // A single server's incomplete groups past their pool's timeout (a
  // cluster member's ClusterSteps does it over the cluster). Last: stops
  // before anything it uses goes.
  std::unique_ptr<PeriodicThread> group_expiry_;
  // Releases steps idle past --step-ttl.
  std::unique_ptr<PeriodicThread> step_expiry_;
  bool shut_down_ = false;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_SERVER_H_
