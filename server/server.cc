#include "server/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "grpc/grpc.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "server/cluster/cluster.h"
#include "server/cluster/cluster_monitor.h"
#include "server/cluster/cluster_admin_service.h"
#include "server/cluster/cluster_pool_directory.h"
#include "server/cluster/incarnation.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/member_service.h"
#include "server/control/rendezvous_service.h"
#include "server/control/routing_agreement.h"
#include "server/control/scheduler_service.h"
#include "server/control/telemetry_service.h"
#include "server/delivery/trainer_service.h"
#include "server/ingest/rollouts_service.h"
#include "server/guard_metrics.h"
#include "server/ops/auth.h"
#include "server/ops/build_info.h"
#include "server/ops/call_log.h"
#include "server/ops/h2_tls_context.h"
#include "server/ops/metrics/metrics_endpoint.h"
#include "server/ops/metrics/process_metrics.h"
#include "server/ops/metrics/scrape_registry.h"
#include "server/ops/server_metrics.h"
#include "server/ops/token_gate.h"
#include "server/ops/watched_tls.h"
#include "server/store/local_pools.h"
#include "server/store/log_replay.h"
#include "server/store/sample_store.h"
#include "server/store/step_activity.h"
#include "server/store/step_directory.h"
#include "spdlog/spdlog.h"

namespace rollpack {

int64_t DefaultMaxMemoryBytes() {
  const int64_t pages = sysconf(_SC_PHYS_PAGES);
  const int64_t page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return int64_t{8} << 30;
  return pages * page_size / 2;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty() && options.tls_key.empty() && options.tls_client_ca.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert.empty() || options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  // Re-read while serving: replacing the files rotates them (docs/operations.md).
  return WatchedServerCredentials({options.tls_cert, options.tls_key, options.tls_client_ca},
                                  options.tls_refresh);
}

namespace {

// gRPC reports a failed bind without its reason; binding the same IPv4
// address once more here finds it (": address in use", say). Empty when
// the address is not an IPv4 host:port or binds now.
std::string WhyCannotBind(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port)) return "";
  std::string host = listen.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  const int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  close(fd);
  if (rc == 0) return "";
  return err == EADDRINUSE ? ": address in use" : absl::StrCat(": ", std::strerror(err));
}

}  // namespace

bool IsLoopbackListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

int RollpackServer::metrics_port() const {
  return exporter_ != nullptr ? exporter_->port() : 0;
}

absl::Status ValidateServerOptions(const ServerOptions& options) {
  const size_t colon = options.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    // gRPC would take "127.0.0.1" as 127.0.0.1:443.
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen \"", options.listen, "\": expected HOST:PORT (port 0 picks a free one)"));
  }
  if (options.max_memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-memory is ", options.max_memory_bytes, ": bytes, >= 0 (0 = half the RAM)"));
  }
  if (options.max_pool_memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-pool-memory is ", options.max_pool_memory_bytes, ": bytes, >= 0 (0 = off)"));
  }
  if (options.step_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--step-ttl is ", absl::FormatDuration(options.step_ttl), ": >= 0 (0 = never)"));
  }
  if (options.fetch.max_streams_per_client < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max-streams-per-client is ",
                                                   options.fetch.max_streams_per_client,
                                                   ": >= 0 (0 = no limit)"));
  }
  if (options.fetch.stream_buffer_bytes < 0 &&
      options.fetch.stream_buffer_bytes != FetchOptions::kStreamBufferAuto) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stream-buffer-memory is ", options.fetch.stream_buffer_bytes,
        ": bytes, >= 0 (0 = no bound), or -1 (the default: --max-memory)"));
  }
  if (options.fetch.write_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stream-write-timeout is ", absl::FormatDuration(options.fetch.write_timeout),
        ": >= 0 (0 = never)"));
  }
  if (options.max_connection_idle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-connection-idle is ", absl::FormatDuration(options.max_connection_idle),
        ": >= 0 (0 = never)"));
  }
  if (options.max_pools < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-pools is ", options.max_pools, ": >= 0 (0 = no limit)"));
  }
  if (options.max_samples_per_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-samples-per-step is ", options.max_samples_per_step, ": >= 0 (0 = no limit)"));
  }
  if (options.ingest.max_samples_per_message < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-samples-per-message is ", options.ingest.max_samples_per_message,
                     ": >= 0 (0 = no limit)"));
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-message-bytes is ", options.max_message_bytes, ": must be > 0"));
  }
  if (options.transport_memory_bytes < 0 ||
      (options.transport_memory_bytes > 0 &&
       options.transport_memory_bytes < options.max_message_bytes)) {
    // gRPC could never take in a message of the largest size allowed.
    return absl::InvalidArgumentError(absl::StrCat(
        "--transport-memory is ", options.transport_memory_bytes,
        ": 0 (no quota) or at least --max-message-bytes (", options.max_message_bytes, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RollpackServer>> RollpackServer::Start(
    const ServerOptions& options) {
  RETURN_IF_ERROR(ValidateServerOptions(options));
  std::unique_ptr<RollpackServer> server(new RollpackServer());
  server->store_ = std::make_unique<SampleStore>(
      options.max_memory_bytes > 0 ? options.max_memory_bytes : DefaultMaxMemoryBytes());
  server->store_->set_max_pool_bytes(options.max_pool_memory_bytes);
  server->store_->set_max_pools(options.max_pools);
  // Whether this member starts with its data (docs/cluster.md, "Data loss").
  bool log_had_records = false;
  if (!options.data_dir.empty()) {
    DurableLogOptions log_options;
    log_options.dir = options.data_dir;
    log_options.fsync = options.fsync;
    log_options.batch_interval = options.fsync_batch_interval;
    log_options.compact_min_dead_bytes = options.compact_min_dead_bytes;
    std::vector<LogRecord> records;
    ASSIGN_OR_RETURN(std::unique_ptr<DurableLog> log, DurableLog::Open(log_options, &records, &server->recovery_));
    log_had_records = !records.empty();
    RETURN_IF_ERROR(ReplayLog(records, server->store_.get()));
    server->log_ = std::move(log);
    server->store_->AttachLog(server->log_.get());
  }
  server->registry_ = std::make_shared<metrics::ScrapeRegistry>();
  server->metrics_ = std::make_unique<ServerMetrics>(server->registry_.get(), server->store_.get());
  AddBuildInfoMetric(*server->registry_);
  metrics::AddProcessMetrics(*server->registry_);
  if (server->log_ != nullptr) {
    server->registry_
        ->AddGauge("rollpack_durable_log_cut_bytes",
                   "Bytes cut off the end of the durable log at start (an unfinished last write; "
                   "kept in DIR/rollpack.log.cut-OFFSET-NANOS)")
        .Add({})
        .Set(static_cast<double>(server->recovery_.torn_tail_bytes));
    // Read through the server, as the log may be gone at shutdown.
    server->registry_->AddCollectCallback(
        [s = server.get(),
         failures = &server->registry_->AddGauge(
             "rollpack_durable_log_compaction_failures",
             "Compactions of the durable log that failed since start (full disk, I/O error); the "
             "old log stays and the next release retries")] {
          if (s->log_ != nullptr) {
            failures->Add({}).Set(static_cast<double>(s->log_->compaction_failures()));
          }
        });
  }
  if (!options.auth_tokens_file.empty()) {
    ASSIGN_OR_RETURN(Authorizer auth, Authorizer::FromFile(options.auth_tokens_file));
    server->auth_ = std::make_unique<Authorizer>(std::move(auth));
    server->auth_tokens_file_ = options.auth_tokens_file;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, MakeServerCredentials(options));
  const bool cluster_mode = !options.cluster_etcd.empty();
  const bool mutual_tls = !options.tls_cert.empty() && !options.tls_client_ca.empty();
  if (cluster_mode && (!options.auth_tokens_file.empty() || !options.tls_cert.empty()) &&
      !mutual_tls) {
    // Members hold no token: they prove membership with a certificate.
    return absl::InvalidArgumentError(
        "--cluster-etcd with --auth-tokens or --tls-cert needs mutual TLS (--tls-cert, "
        "--tls-key and --tls-client-ca): members authenticate each other by certificate "
        "(docs/cluster.md, \"Threat model\")");
  }
  if (cluster_mode && mutual_tls) {
    if (options.cluster_member_identity.empty()) {
      return absl::InvalidArgumentError(
          "--cluster-member-identity is empty: with mutual TLS it names the Common Name of "
          "member certificates");
    }
    if (server->auth_ == nullptr) server->auth_ = std::make_unique<Authorizer>();
    server->auth_->set_member_identity(options.cluster_member_identity);
  }
  if (cluster_mode) {
    auto cluster_steps = std::make_unique<ClusterSteps>(server->store_.get());
    server->cluster_steps_ = cluster_steps.get();
    server->steps_ = std::move(cluster_steps);
    server->member_ = std::make_unique<MemberService>(server->store_.get(), server->cluster_steps_,
                                                      server->auth_.get());
  } else {
    server->steps_ = std::make_unique<LocalSteps>(server->store_.get());
  }
  // A live step a forced DeletePool releases counts as ReleaseStep's would.
  auto on_step_released = [metrics = server->metrics_.get()](const ReleaseResult& r) {
    if (metrics != nullptr) metrics->OnStepReleased(r.released_samples, r.freed_bytes);
  };
  if (cluster_mode) {
    ClusterPoolsOptions pools;
    pools.on_step_released = on_step_released;
    auto cluster_pools = std::make_unique<ClusterPoolDirectory>(
        server->store_.get(), server->steps_.get(), std::move(pools));
    server->cluster_pools_ = cluster_pools.get();
    server->pools_ = std::move(cluster_pools);
  } else {
    server->pools_ = std::make_unique<LocalPools>(server->store_.get(), server->steps_.get(),
                                                  on_step_released);
  }
  // Set before serving (the store reads it without a lock); a cluster's
  // answers UNAVAILABLE, a retryable code, until the join below attaches it.
  server->store_->AttachPoolDirectory(server->pools_.get());
  server->rollouts_ = std::make_unique<RolloutsService>(server->store_.get(), server->pools_.get(),
                                                        server->metrics_.get(),
                                                        server->auth_.get(), options.ingest);
  server->step_activity_ = std::make_unique<StepActivity>();
  if (server->member_ != nullptr) server->member_->AttachActivity(server->step_activity_.get());
  server->scheduler_ = std::make_unique<SchedulerService>(
      server->steps_.get(), server->metrics_.get(), server->auth_.get(),
      server->step_activity_.get(), options.max_samples_per_step);
  FetchOptions fetch = options.fetch;
  if (fetch.stream_buffer_bytes == FetchOptions::kStreamBufferAuto) {
    fetch.stream_buffer_bytes =
        options.max_memory_bytes > 0 ? options.max_memory_bytes : DefaultMaxMemoryBytes();
  }
  server->trainer_ = std::make_unique<TrainerService>(server->steps_.get(), server->metrics_.get(),
                                                      server->auth_.get(), fetch,
                                                      server->step_activity_.get());
  server->registry_->AddCollectCallback(
      [budget = &server->trainer_->send_budget(),
       held = &server->registry_->AddGauge(
           "rollpack_stream_buffer_bytes",
           "Bytes of micro-batches encoded for trainer streams and not yet taken by the "
           "transport (bounded by --stream-buffer-memory)"),
       waits = &server->registry_->AddCounter(
           "rollpack_stream_buffer_waits_total",
           "Micro-batch writes that waited for --stream-buffer-memory (streams holding it "
           "whose clients read slowly or not at all)"),
       waiting = &server->registry_->AddGauge(
           "rollpack_stream_buffer_waiting_streams",
           "Trainer streams waiting for --stream-buffer-memory to write their next micro-batch")] {
        held->Add({}).Set(static_cast<double>(budget->in_use()));
        waiting->Add({}).Set(static_cast<double>(budget->waiting()));
        // Scrapes are serialized: the counter catches up with the budget's.
        prometheus::Counter& counter = waits->Add({});
        counter.Increment(static_cast<double>(budget->waits()) - counter.Value());
      });

  grpc::EnableDefaultHealthCheckService(true);
  // Links grpc/health/v1/health.pb.cc (and so registers its descriptor) for
  // reflection: grpcurl / buf curl can then call grpc.health.v1.Health/Check.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  const H2GuardChoice guard_choice =
      ChooseH2Guard(options.h2_guard, mutual_tls, IsLoopbackListen(options.listen),
                    !options.auth_tokens_file.empty());
  const bool guarded = guard_choice.fronted;
  spdlog::info("rollpackd: gRPC port {} {} the HTTP/2 guard: {}", options.listen,
               guarded ? "fronted by" : "not fronted by", guard_choice.why);
  if (guarded) {
    // rollpackd accepts the port's connections itself and hands each to gRPC
    // once started (server/ops/h2_guard.h); gRPC listens on nothing.
    H2GuardOptions guard_options = options.h2_guard_options;
    guard_options.auth = server->auth_.get();
    // What clients make the guard hold, beside what they make gRPC hold.
    guard_options.client_buffer_memory = options.transport_memory_bytes / 4;
    if (!options.tls_cert.empty()) {
      // TLS without client certificates: the guard ends it (gRPC takes
      // only plaintext sockets), with the files watched as gRPC would.
      ASSIGN_OR_RETURN(guard_options.tls, H2TlsContext::Create(options.tls_cert, options.tls_key,
                                                               options.tls_refresh));
    }
    ASSIGN_OR_RETURN(server->h2_guard_, H2Guard::Listen(options.listen, std::move(guard_options)));
    port = server->h2_guard_->port();
  } else {
    builder.AddListeningPort(options.listen, credentials, &port);
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(server->metrics_->InterceptorFactory());
  server->call_log_ = std::make_unique<CallLog>(server->auth_.get());
  interceptors.push_back(server->call_log_->InterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // Declared whatever the configuration: dashboards and scrapers see every
  // family rollpackd can export.
  prometheus::Family<prometheus::Counter>& refused_at_start = server->registry_->AddCounter(
      TokenGate::kRefusedMetric,
      "Calls refused from their headers, before any request message was read: no or an "
      "unknown token (UNAUTHENTICATED), a role that may not call the method "
      "(PERMISSION_DENIED); TLS ports with --auth-tokens not fronted by the HTTP/2 guard only");
  if (server->auth_ != nullptr && !options.tls_cert.empty() && !guarded) {
    // Refuses calls without a valid token from their headers, before any
    // request message is read (server/ops/token_gate.h). gRPC 1.51 runs an
    // AuthMetadataProcessor on TLS ports only (it aborts on an insecure one);
    // on plaintext, handlers check the token and the transport quota bounds
    // what an unauthenticated client makes the server hold. A guarded TLS
    // port reaches gRPC as plaintext: the guard's token check stands in.
    credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenGate>(server->auth_.get(), &refused_at_start));
  }
  if (options.transport_memory_bytes > 0) {
    grpc::ResourceQuota quota("rollpackd-transport");
    quota.Resize(static_cast<size_t>(options.transport_memory_bytes));
    builder.SetResourceQuota(quota);
  }
  if (!options.accept_compressed_requests) {
    builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
    builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);
  }
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Clients ping every 20 s while a call is open (ClientOptions::
  // keepalive_time): more often than gRPC's default of one per 5 minutes
  // without data, which a client-streaming call (ingest) never sends.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  // gRPC sets SO_REUSEPORT by default: a second rollpackd on a port in use
  // would start and the kernel would split clients between two stores.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Connections nobody calls on are closed: a client that opened many and
  // went quiet does not keep their buffers. Calls in flight are not idle.
  if (options.max_connection_idle > absl::ZeroDuration() &&
      options.max_connection_idle < absl::InfiniteDuration()) {
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_IDLE_MS,
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(options.max_connection_idle),
                                           std::numeric_limits<int>::max())));
  }
  for (const auto& [name, value] : options.grpc_int_args) builder.AddChannelArgument(name, value);
  builder.RegisterService(server->rollouts_.get());
  builder.RegisterService(server->scheduler_.get());
  builder.RegisterService(server->trainer_.get());
  if (server->member_ != nullptr) builder.RegisterService(server->member_.get());
  server->rendezvous_ = std::make_unique<RendezvousService>();
  server->rendezvous_->set_authorizer(server->auth_.get());
  builder.RegisterService(server->rendezvous_.get());
  server->routing_agreement_ = std::make_unique<RoutingAgreementBook>(server->registry_.get());
  server->telemetry_ = std::make_unique<TelemetryService>(
      server->store_.get(), server->routing_agreement_.get(), server->auth_.get());
  builder.RegisterService(server->telemetry_.get());
  server->cluster_admin_ = std::make_unique<ClusterAdminService>(
      server->store_.get(), server->auth_.get(), cluster_mode,
      [s = server.get()] { return s->address(); }, server->registry_.get());
  builder.RegisterService(server->cluster_admin_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, WhyCannotBind(options.listen)));
  }
  server->port_ = port;
  server->SetServiceHealth(cluster_mode);
  if (guarded) {
    server->h2_guard_->Start(server->server_.get());
  }
  AddGuardMetrics(*server->registry_,
                  guarded ? server->h2_guard_->counters() : nullptr);
  if (!cluster_mode) {
    SampleStore* const store = server->store_.get();
    server->group_expiry_ = std::make_unique<PeriodicThread>(absl::Seconds(1), [store] {
      absl::StatusOr<DropResult> dropped = store->DropExpiredGroups(absl::Now());
      if (!dropped.ok()) {
        spdlog::error("rollpackd: dropping incomplete groups: {}", dropped.status().ToString());
      } else if (dropped->groups > 0) {
        spdlog::warn("rollpackd: dropped {} groups ({} free samples) still incomplete after their "
                     "pool's incomplete_group_timeout_ms",
                     dropped->groups, dropped->group_samples);
      }
    });
  }
  if (options.step_ttl > absl::ZeroDuration() && server->cluster_steps_ != nullptr) {
    server->StartClusterStepExpiry(options.step_ttl);
  } else if (options.step_ttl > absl::ZeroDuration()) {
    StepDirectory* const steps = server->steps_.get();
    StepActivity* const activity = server->step_activity_.get();
    ServerMetrics* const metrics = server->metrics_.get();
    const absl::Duration ttl = options.step_ttl;
    server->step_expiry_ = std::make_unique<PeriodicThread>(
        std::clamp(ttl / 4, absl::Milliseconds(100), absl::Seconds(1)),
        [steps, activity, metrics, ttl] {
          const absl::Time cutoff = absl::Now();
          absl::StatusOr<std::vector<LiveStep>> live = steps->ListSteps("");
          if (!live.ok()) return;
          std::vector<std::string> ids;
          for (const LiveStep& s : *live) ids.push_back(s.step->step_id);
          activity->Retain(ids, cutoff);
          for (const std::string& id : activity->Idle(ids, absl::Now(), ttl)) {
            // Checked again right before: a stream may have started since,
            // or the id may now be another step.
            auto seen = std::find_if(live->begin(), live->end(), [&](const LiveStep& s) {
              return s.step->step_id == id;
            });
            absl::StatusOr<std::shared_ptr<const Step>> now_live = steps->GetStep(id);
            if (!now_live.ok() || now_live->get() != seen->step.get() ||
                !activity->StillIdle(id, absl::Now(), ttl)) {
              continue;
            }
            absl::StatusOr<ReleaseResult> released = steps->ReleaseStep(id);
            if (!released.ok()) continue;  // released meanwhile
            activity->StepReleased(id);
            metrics->OnStepReleased(released->released_samples, released->freed_bytes);
            metrics->OnStepExpired();
            spdlog::warn("rollpackd: released step \"{}\" ({} samples deleted, {} returned): no "
                         "trainer stream and no activity for --step-ttl {}",
                         id, released->released_samples, released->returned_samples,
                         absl::FormatDuration(ttl));
          }
        });
  }
  if (!options.metrics_listen.empty()) {
    metrics::MetricsEndpointOptions endpoint;
    endpoint.listen = options.metrics_listen;
    endpoint.basic_auth = options.metrics_basic_auth;
    absl::StatusOr<std::unique_ptr<metrics::MetricsEndpoint>> exporter =
        metrics::MetricsEndpoint::Start(endpoint, server->registry_);
    if (!exporter.ok()) {
      server->Shutdown(absl::ZeroDuration());
      return exporter.status();
    }
    server->exporter_ = *std::move(exporter);
  }
  server->host_ = options.listen.substr(0, options.listen.rfind(':'));
  if (server->host_.empty() || server->host_ == "0.0.0.0" || server->host_ == "[::]") {
    server->host_ = "127.0.0.1";
  }
  if (cluster_mode) {
    ClusterOptions cluster;
    cluster.etcd.endpoints = options.cluster_etcd;
    cluster.name = options.cluster_name;
    cluster.advertise =
        options.cluster_advertise.empty() ? server->address() : options.cluster_advertise;
    cluster.lease_ttl = options.cluster_lease_ttl;
    if (options.data_dir.empty()) {
      cluster.incarnation = NewIncarnation();
    } else {
      ASSIGN_OR_RETURN(cluster.incarnation, DataDirIncarnation(options.data_dir, log_had_records));
    }
    cluster.peer_max_receive_bytes = int64_t{options.max_message_bytes} + (int64_t{5} << 20);
    if (mutual_tls) {
      // The member's own certificate is its client identity towards peers,
      // re-read like the port's.
      ASSIGN_OR_RETURN(cluster.peer_credentials,
                       WatchedChannelCredentials(
                           {options.tls_cert, options.tls_key, options.tls_client_ca},
                           options.tls_refresh, options.cluster_member_identity));
    }
    if (!options.cluster_etcd_ca.empty()) {
      ASSIGN_OR_RETURN(cluster.etcd.tls_ca, ReadPemFile(options.cluster_etcd_ca, "--cluster-etcd-ca"));
    }
    if (!options.cluster_etcd_cert.empty()) {
      ASSIGN_OR_RETURN(cluster.etcd.tls_cert,
                       ReadPemFile(options.cluster_etcd_cert, "--cluster-etcd-cert"));
    }
    if (!options.cluster_etcd_key.empty()) {
      ASSIGN_OR_RETURN(cluster.etcd.tls_key, ReadPemFile(options.cluster_etcd_key, "--cluster-etcd-key"));
    }
    if (!options.cluster_etcd_ca.empty()) {
      ASSIGN_OR_RETURN(cluster.etcd.credentials,
                       WatchedChannelCredentials({options.cluster_etcd_cert,
                                                  options.cluster_etcd_key,
                                                  options.cluster_etcd_ca},
                                                 options.tls_refresh));
    }
    absl::StatusOr<std::unique_ptr<Cluster>> joined = Cluster::Join(cluster);
    if (!joined.ok()) {
      server->Shutdown(absl::ZeroDuration());
      return Annotate(joined.status(), "joining the cluster");
    }
    server->cluster_ = *std::move(joined);
    Cluster* const c = server->cluster_.get();
    server->AttachClusterSteps(c);
    server->cluster_admin_->AttachCluster(c);
    server->ReportCluster();
    server->registry_->AddCollectCallback(
        [steps = server->cluster_steps_,
         planning = &server->registry_->AddCounter(
             "rollpack_cluster_planning_bytes_total",
             "Bytes this member exchanged with the others to plan steps (sample listings "
             "and holds: metadata only)."),
         pulled = &server->registry_->AddCounter(
             "rollpack_cluster_pulled_bytes_total",
             "Bytes of samples this member pulled from the members holding them to serve "
             "trainer ranks.")] {
          metrics::Counter& p = planning->Add({});
          p.Increment(static_cast<double>(steps->planning_bytes()) - p.Value());
          metrics::Counter& q = pulled->Add({});
          q.Increment(static_cast<double>(steps->pulled_bytes()) - q.Value());
        });
  }
  // After the join: in cluster mode the capture port stores into this
  // member, which must be in its cluster to adopt a pool's model.
  server->capture_metrics_ = std::make_unique<CaptureMetrics>(*server->registry_);
  if (!options.capture.listen.empty()) {
    if (absl::Status started = server->StartCapture(options.capture); !started.ok()) {
      server->Shutdown(absl::ZeroDuration());
      return started;
    }
  }
  return server;
}

absl::StatusOr<std::pair<std::string, int>> ParseGrpcIntArg(absl::string_view text) {
  const size_t eq = text.find('=');
  int value = 0;
  if (eq == absl::string_view::npos || eq == 0 || !absl::SimpleAtoi(text.substr(eq + 1), &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc-arg \"", text, "\": expected NAME=INTEGER, e.g. "
                     "grpc.http2.lookahead_bytes=16777216"));
  }
  return std::make_pair(std::string(text.substr(0, eq)), value);
}

RollpackServer::~RollpackServer() { Shutdown(absl::ZeroDuration()); }

std::string RollpackServer::address() const { return absl::StrCat(host_, ":", port_); }

absl::Status RollpackServer::ReloadTokens() {
  if (auth_ == nullptr || auth_tokens_file_.empty()) return absl::OkStatus();
  return auth_->ReloadTokens(auth_tokens_file_);
}

void RollpackServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  const absl::Time start = absl::Now();
  group_expiry_.reset();
  step_expiry_.reset();
  // Its requests in flight are dropped: their clients see the connection
  // close, as they would if the engine went away.
  capture_.reset();
  server_->GetHealthCheckService()->Shutdown();
  const int streams = trainer_ != nullptr ? trainer_->active_streams() : 0;
  if (grace > absl::ZeroDuration()) {
    spdlog::info("rollpackd: shutting down: health NOT_SERVING, no new calls; {} trainer "
                 "stream(s) in flight get up to {}",
                 streams, absl::FormatDuration(grace));
  }
  if (h2_guard_ != nullptr) h2_guard_->StopAccepting();
  server_->Shutdown(absl::ToChronoTime(start + grace));
  server_->Wait();
  h2_guard_.reset();
  if (grace > absl::ZeroDuration()) {
    const absl::Duration took = absl::Now() - start;
    spdlog::info("rollpackd: calls ended in {}{}", absl::FormatDuration(absl::Trunc(took, absl::Milliseconds(1))),
                 took >= grace ? " (the grace period ran out: what was left was cancelled)" : "");
  }
  exporter_.reset();
  if (cluster_ != nullptr) {
    // From here on an etcd that is gone costs each background call (the
    // steps' upkeep, the keep-alive, the lease revokes) one short attempt,
    // not its retry budget: Cluster::~Cluster.
    cluster_->etcd()->StopRetrying();
    cluster_pools_->Attach(nullptr);
    cluster_admin_->AttachCluster(nullptr);
    cluster_steps_->Detach();
    etcd_health_.reset();
    cluster_.reset();
    if (grace > absl::ZeroDuration()) spdlog::info("rollpackd: left the cluster");
  }
}

void RollpackServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace rollpack
