// rollpackd: the rollpack sidecar server.
#include <sys/resource.h>

#include <algorithm>
#include <pthread.h>
#include <sys/stat.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/cluster/cluster.h"
#include "server/cluster/cluster_config_check.h"
#include "server/cluster/member_count_watch.h"
#include "server/ops/build_info.h"
#include "base/keep_freed_memory.h"
#include "server/ops/log_format.h"
#include "server/ops/metrics/metrics_endpoint.h"
#include "server/server.h"
#include "server/store/sample_store.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC address host:port; port 0 picks a free one (see --port-file)");
ABSL_FLAG(int64_t, max_memory, 0,
          "bytes of samples to hold before PutSamples gets RESOURCE_EXHAUSTED; 0 = half the RAM");
ABSL_FLAG(int, max_message_bytes, 512 << 20, "largest gRPC message, either way");
ABSL_FLAG(std::vector<std::string>, grpc_arg, {},
          "NAME=INTEGER gRPC channel arguments for the server, given once, comma-separated (e.g. "
          "grpc.http2.lookahead_bytes=16777216,grpc.http2.bdp_probe=0); tuning, measure first");
ABSL_FLAG(std::string, port_file, "",
          "write the bound port to this file once serving (for port 0)");
ABSL_FLAG(std::string, data_dir, "",
          "durable mode: log every acknowledged mutation under this directory and recover "
          "it at start (docs/reliability.md)");
ABSL_FLAG(std::string, fsync, "always",
          "durable mode: always (fdatasync before each acknowledgement, group commit), batch "
          "(every --fsync-batch-ms) or never");
ABSL_FLAG(int, fsync_batch_ms, 50, "fsync interval of --fsync batch");
ABSL_FLAG(int64_t, compact_min_dead_bytes, int64_t{64} << 20,
          "durable mode: compact the log once released records exceed this many bytes "
          "and half the file");
// What a stop may take past --shutdown-grace-seconds (gRPC's own shutdown,
// freeing the store, closing the durable log) before rollpackd exits
// without finishing it.
constexpr absl::Duration kShutdownOverrun = absl::Seconds(10);

ABSL_FLAG(int, shutdown_grace_seconds, 10,
          "on SIGTERM/SIGINT, let streams in flight finish for this long");
// Operations (docs/operations.md).
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics (GET /metrics) on host:port; empty = off. "
          "127.0.0.1:PORT keeps them on loopback");
ABSL_FLAG(std::string, metrics_port_file, "",
          "write the bound metrics port to this file once serving (for port 0)");
// The HTTP capture port (docs/capture.md, shared/spec/capture.md).
ABSL_FLAG(std::string, capture_listen, "",
          "serve the HTTP capture port on host:port: a reverse proxy for --capture-upstream "
          "that stores every generation it forwards as a sample; empty = off");
ABSL_FLAG(std::string, capture_upstream, "",
          "the inference server the capture port forwards to, http://HOST:PORT");
ABSL_FLAG(std::string, capture_engine, "vllm", "the upstream's engine: vllm or sglang");
ABSL_FLAG(std::string, capture_pool, "",
          "the pool captured samples go to unless a request names one (X-Rollpack-Pool)");
ABSL_FLAG(std::string, capture_model, "",
          "a rollpack.v1.ModelSpec in protobuf JSON, registered on --capture-pool at start "
          "like RegisterModel");
ABSL_FLAG(std::string, capture_pool_options, "",
          "a rollpack.v1.PoolOptions in protobuf JSON (e.g. {\"requiredScalars\": "
          "[\"reward\"]}), registered with --capture-model");
ABSL_FLAG(bool, capture_keep_routing, false,
          "leave the routing payload in the responses the capture port returns");
ABSL_FLAG(int64_t, capture_timeout_seconds, 600,
          "how long the capture port waits for the engine's response headers, then between "
          "body reads (also a client connection's idle limit)");
ABSL_FLAG(int64_t, capture_max_body_bytes, int64_t{1} << 30,
          "requests larger than this are refused 413 on the capture port; larger responses "
          "are passed through and not captured");
ABSL_FLAG(int64_t, capture_record_memory, int64_t{256} << 20,
          "bytes of engine answers the capture port holds read and waiting to be stored, all "
          "connections together; past it a connection reads its next answer only once room is "
          "made (the engine's writes wait); 0 = no bound");
ABSL_FLAG(std::string, capture_port_file, "",
          "write the bound capture port to this file once serving (for port 0)");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warning, error or off: control calls are logged at info, "
          "refusals at warning (rate-limited), data calls and health checks at debug");
ABSL_FLAG(std::string, log_format, "text",
          "text, or json: one JSON object per line (time, level, thread, msg)");
ABSL_FLAG(std::string, metrics_basic_auth_file, "",
          "file of `user:password` lines: GET /metrics needs HTTP basic auth; empty = none");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve gRPC over TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates signed by it (mutual TLS)");
ABSL_FLAG(int, tls_refresh_seconds, 60,
          "how often the --tls-* and --cluster-etcd-* files are checked for a replacement: "
          "replacing them rotates certificates without a restart");
ABSL_FLAG(std::string, auth_tokens, "",
          "file of `ROLE TOKEN` lines (roles producer, trainer, admin): require "
          "`authorization: Bearer TOKEN` metadata; empty = no auth");
ABSL_FLAG(int, max_concurrent_streams, 0,
          "FetchMicrobatches streams in flight at once before RESOURCE_EXHAUSTED; 0 = no limit");
ABSL_FLAG(int, max_streams_per_client, 0,
          "FetchMicrobatches streams in flight per client host before RESOURCE_EXHAUSTED (one "
          "client cannot take all of --max-concurrent-streams); 0 = no limit");
ABSL_FLAG(absl::Duration, stream_write_timeout, absl::Minutes(10),
          "end a trainer stream whose client took no micro-batch for this long (it stopped "
          "reading: the micro-batch in flight is held for it); 0 = never");
ABSL_FLAG(absl::Duration, max_connection_idle, absl::Minutes(15),
          "close a client connection with no call for this long (GOAWAY: clients reconnect "
          "when they next call); 0 = never");
ABSL_FLAG(int64_t, stream_buffer_memory, -1,
          "bytes of micro-batches encoded for trainer streams and not yet taken by the "
          "transport; a stream past it waits for bytes to come back. Above every rank's "
          "prefetch (ranks x (prefetch + 1) x the largest micro-batch); -1 = --max-memory; 0 = "
          "no bound");
ABSL_FLAG(int64_t, transport_memory, int64_t{1} << 30,
          "bytes gRPC's transport may hold for all connections (a gRPC resource quota): under "
          "pressure it shrinks windows, then cancels streams; 0 = no quota");
ABSL_FLAG(std::string, h2_guard, "auto",
          "front a plaintext gRPC port with rollpackd's HTTP/2 guard (per-client-host "
          "stream-reset budgets against HTTP/2 rapid reset, connection limits, the token check "
          "of --auth-tokens from the headers): true, false, or auto = when the port is not on a "
          "loopback address, or is with --auth-tokens. A TLS port without --tls-client-ca is fronted "
          "too, the guard ending TLS itself; mutual-TLS ports never are");
ABSL_FLAG(int64_t, stream_reset_budget, 1000,
          "RST_STREAM frames one client host may send at once through the HTTP/2 guard, of "
          "streams the server has not ended (cancelling answered calls is free); refills "
          "in 30 s. Over it its connection is closed (GOAWAY ENHANCE_YOUR_CALM) and the host "
          "cools down; 0 = no limit");
ABSL_FLAG(absl::Duration, abuse_cooldown, absl::Seconds(10),
          "how long the HTTP/2 guard refuses new connections of a client host that overdrew its "
          "stream-reset budget or flooded header blocks");
ABSL_FLAG(int, max_connections_per_client, 1024,
          "connections one client host may hold at once on a plaintext port (HTTP/2 guard); 0 = "
          "no limit");
ABSL_FLAG(int, max_connections, 16384,
          "connections all clients together may hold on a plaintext port (HTTP/2 guard; each "
          "takes 3 file descriptors, and the limit is lowered to what RLIMIT_NOFILE allows); 0 = "
          "only RLIMIT_NOFILE's bound");
ABSL_FLAG(bool, accept_compressed_requests, false,
          "accept gzip/deflate-compressed requests (off: refused from their headers, before a "
          "message is inflated)");
ABSL_FLAG(bool, first_microbatch_priority, true,
          "hold trainer streams' prefetch writes (up to 100 ms) while other streams' first "
          "micro-batches are in flight, so a step starts when the last rank has its first");
ABSL_FLAG(int, ingest_messages_in_flight, 4,
          "PutSamples messages of one stream parsed and validated at once on the ingest "
          "workers (each holds up to a message's bytes); 1 = one at a time, no workers; at "
          "most 64");
ABSL_FLAG(int, ingest_threads, 0, "ingest worker threads; 0 = one per core, at most 8");
ABSL_FLAG(int64_t, max_pool_memory, 0,
          "bytes one pool may hold before its PutSamples get RESOURCE_EXHAUSTED; 0 = only "
          "--max-memory applies");
ABSL_FLAG(int, max_samples_per_message, 65536,
          "samples one PutSamples message may carry (RESOURCE_EXHAUSTED past it; the Python "
          "and C++ producers split at 65536 by default); 0 = only --max-message-bytes");
ABSL_FLAG(int64_t, max_samples_per_step, 1 << 20,
          "samples one step may take (CreateStep answers RESOURCE_EXHAUSTED past it; planning "
          "10^6 samples takes about 0.5 s on 2 cores); 0 = no limit");
ABSL_FLAG(int64_t, max_pools, 64,
          "pools the server may hold (0 = no limit); each has its own metric series");
ABSL_FLAG(absl::Duration, step_ttl, absl::ZeroDuration(),
          "release a step with no open trainer stream and no activity for this long (e.g. 30m: "
          "its controller crashed and never released it); 0 = never; counted in "
          "rollpack_steps_expired_total; not with --cluster-etcd yet");
ABSL_FLAG(std::vector<std::string>, cluster_etcd, {},
          "cluster mode (docs/cluster.md): etcd client URLs, comma-separated "
          "(http://HOST:PORT, https://HOST:PORT with --cluster-etcd-ca, or HOST:PORT); unset = a "
          "single server");
ABSL_FLAG(std::string, cluster_advertise, "",
          "host:port the other members reach this one at; default: the --listen address");
ABSL_FLAG(std::string, cluster_name, "rollpack",
          "etcd key prefix of the cluster, so several clusters can share one etcd");
ABSL_FLAG(int, cluster_expect_members, 0,
          "warn every minute while fewer members than this are live (members that failed to "
          "start, or joined under another --cluster-name); 0 = never");
ABSL_FLAG(int, cluster_lease_seconds, 5,
          "membership lease TTL: a member that stops renewing it leaves after this long");
ABSL_FLAG(std::string, cluster_member_identity, "rollpack-member",
          "with mutual TLS (--tls-cert, --tls-key, --tls-client-ca): the Common Name of member "
          "certificates; the Member service answers only peers presenting one");
ABSL_FLAG(std::string, cluster_etcd_ca, "",
          "PEM CA of etcd's server certificate: reach https:// --cluster-etcd endpoints over TLS");
ABSL_FLAG(std::string, cluster_etcd_cert, "",
          "PEM client certificate for etcd (--client-cert-auth; with etcd auth on, its Common "
          "Name is the etcd user)");
ABSL_FLAG(std::string, cluster_etcd_key, "", "PEM private key of --cluster-etcd-cert");

namespace {

// Accepts the documented dashed spelling (--max-memory) for absl's
// underscored flag names (--max_memory).
std::vector<std::string> NormalizeFlagSpelling(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "--") break;
    if (arg.rfind("--", 0) != 0) continue;
    const size_t end = std::min(arg.find('='), arg.size());
    std::replace(arg.begin() + 2, arg.begin() + end, '-', '_');
  }
  return args;
}

// Written whole (a rename) so a reader never sees half a number; nothing
// when `path` is empty or the port is off.
void WritePortFile(const std::string& path, int port) {
  if (path.empty() || port <= 0) return;
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  rollpack::KeepFreedMemory();
  // Each client connection of a plaintext port takes 3 descriptors (the
  // HTTP/2 guard's relay): the soft limit, often 1024, goes up to the hard
  // one, as Go's runtime does for every server.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  absl::SetProgramUsageMessage("rollpackd --listen 127.0.0.1:50051 [--max-memory BYTES]");
  // absl's --version prints this and exits 0, before any other flag is acted on.
  absl::FlagsUsageConfig usage_config;
  usage_config.version_string = [] { return rollpack::VersionLine("rollpackd") + "\n"; };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<std::string> args = NormalizeFlagSpelling(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (absl::Status logging = rollpack::ConfigureLogging(absl::GetFlag(FLAGS_log_level),
                                                        absl::GetFlag(FLAGS_log_format));
      !logging.ok()) {
    std::fprintf(stderr, "rollpackd: %s\n", std::string(logging.message()).c_str());
    return 2;
  }

  // Block the stop signals in every thread (gRPC's inherit the mask) and
  // wait for them synchronously: no work in a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  // SIGHUP re-reads --auth-tokens (rotation without a restart).
  sigset_t waited = stop_signals;
  sigaddset(&waited, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &waited, nullptr);

  rollpack::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.max_memory_bytes = absl::GetFlag(FLAGS_max_memory);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  for (const std::string& text : absl::GetFlag(FLAGS_grpc_arg)) {
    absl::StatusOr<std::pair<std::string, int>> arg = rollpack::ParseGrpcIntArg(text);
    if (!arg.ok()) {
      spdlog::error("rollpackd: {}", std::string(arg.status().message()));
      return 2;
    }
    options.grpc_int_args.push_back(*std::move(arg));
  }
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  if (absl::StatusOr<rollpack::FsyncPolicy> fsync =
          rollpack::ParseFsyncPolicy(absl::GetFlag(FLAGS_fsync));
      fsync.ok()) {
    options.fsync = *fsync;
  } else {
    spdlog::error("rollpackd: {}", std::string(fsync.status().message()));
    return 2;
  }
  options.fsync_batch_interval = absl::Milliseconds(absl::GetFlag(FLAGS_fsync_batch_ms));
  options.compact_min_dead_bytes = absl::GetFlag(FLAGS_compact_min_dead_bytes);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (const std::string users = absl::GetFlag(FLAGS_metrics_basic_auth_file); !users.empty()) {
    if (options.metrics_listen.empty()) {
      spdlog::error("rollpackd: --metrics-basic-auth-file needs --metrics-listen (there is no "
                    "metrics endpoint to protect)");
      return 2;
    }
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> basic_auth =
        rollpack::metrics::ReadBasicAuthFile(users);
    if (!basic_auth.ok()) {
      spdlog::error("rollpackd: --metrics-basic-auth-file: {}",
                    std::string(basic_auth.status().message()));
      return 2;
    }
    options.metrics_basic_auth = *std::move(basic_auth);
  }
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (absl::GetFlag(FLAGS_tls_refresh_seconds) < 1) {
    std::fprintf(stderr, "rollpackd: --tls-refresh-seconds is %d, must be >= 1\n",
                 absl::GetFlag(FLAGS_tls_refresh_seconds));
    return 2;
  }
  options.tls_refresh = absl::Seconds(absl::GetFlag(FLAGS_tls_refresh_seconds));
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens);
  options.fetch.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.fetch.max_streams_per_client = absl::GetFlag(FLAGS_max_streams_per_client);
  options.fetch.write_timeout = absl::GetFlag(FLAGS_stream_write_timeout);
  options.fetch.stream_buffer_bytes = absl::GetFlag(FLAGS_stream_buffer_memory);
  options.max_connection_idle = absl::GetFlag(FLAGS_max_connection_idle);
  options.max_pool_memory_bytes = absl::GetFlag(FLAGS_max_pool_memory);
  options.transport_memory_bytes = absl::GetFlag(FLAGS_transport_memory);
  options.accept_compressed_requests = absl::GetFlag(FLAGS_accept_compressed_requests);
  if (const std::string guard = absl::GetFlag(FLAGS_h2_guard); guard == "auto") {
    options.h2_guard = rollpack::H2GuardMode::kAuto;
  } else if (guard == "true") {
    options.h2_guard = rollpack::H2GuardMode::kOn;
  } else if (guard == "false") {
    options.h2_guard = rollpack::H2GuardMode::kOff;
  } else {
    std::fprintf(stderr, "rollpackd: --h2-guard is \"%s\": auto, true or false\n", guard.c_str());
    return 2;
  }
  options.h2_guard_options.limits.reset_budget = absl::GetFlag(FLAGS_stream_reset_budget);
  options.h2_guard_options.limits.cooldown = absl::GetFlag(FLAGS_abuse_cooldown);
  options.h2_guard_options.limits.max_connections_per_client =
      absl::GetFlag(FLAGS_max_connections_per_client);
  options.h2_guard_options.max_connections = absl::GetFlag(FLAGS_max_connections);
  if (options.h2_guard_options.limits.reset_budget < 0 ||
      options.h2_guard_options.limits.max_connections_per_client < 0 ||
      options.h2_guard_options.max_connections < 0 ||
      options.h2_guard_options.limits.cooldown < absl::ZeroDuration()) {
    std::fprintf(stderr,
                 "rollpackd: --stream-reset-budget, --max-connections-per-client, "
                 "--max-connections and --abuse-cooldown must be >= 0\n");
    return 2;
  }
  options.capture.listen = absl::GetFlag(FLAGS_capture_listen);
  options.capture.upstream = absl::GetFlag(FLAGS_capture_upstream);
  if (const std::string engine = absl::GetFlag(FLAGS_capture_engine); engine == "vllm") {
    options.capture.engine = rollpack::Engine::kVllm;
  } else if (engine == "sglang") {
    options.capture.engine = rollpack::Engine::kSglang;
  } else {
    std::fprintf(stderr, "rollpackd: --capture-engine is \"%s\": vllm or sglang\n",
                 engine.c_str());
    return 2;
  }
  options.capture.pool = absl::GetFlag(FLAGS_capture_pool);
  options.capture.model_file = absl::GetFlag(FLAGS_capture_model);
  options.capture.pool_options_file = absl::GetFlag(FLAGS_capture_pool_options);
  options.capture.keep_routing = absl::GetFlag(FLAGS_capture_keep_routing);
  if (absl::GetFlag(FLAGS_capture_timeout_seconds) < 1 ||
      absl::GetFlag(FLAGS_capture_max_body_bytes) < 1) {
    std::fprintf(stderr,
                 "rollpackd: --capture-timeout-seconds and --capture-max-body-bytes must be "
                 ">= 1\n");
    return 2;
  }
  options.capture.timeout = absl::Seconds(absl::GetFlag(FLAGS_capture_timeout_seconds));
  options.capture.max_body_bytes = absl::GetFlag(FLAGS_capture_max_body_bytes);
  options.capture.record_memory_bytes = absl::GetFlag(FLAGS_capture_record_memory);
  if (options.capture.record_memory_bytes < 0) {
    std::fprintf(stderr, "rollpackd: --capture-record-memory must be >= 0\n");
    return 2;
  }
  if (!options.capture.listen.empty() && options.capture.upstream.empty()) {
    std::fprintf(stderr, "rollpackd: --capture-listen needs --capture-upstream\n");
    return 2;
  }
  options.fetch.first_microbatch_priority = absl::GetFlag(FLAGS_first_microbatch_priority);
  // Each message in flight may hold up to --max-message-bytes.
  options.ingest.messages_in_flight =
      std::clamp(absl::GetFlag(FLAGS_ingest_messages_in_flight), 1, 64);
  options.ingest.threads = std::max(0, absl::GetFlag(FLAGS_ingest_threads));
  options.max_pools = absl::GetFlag(FLAGS_max_pools);
  options.ingest.max_samples_per_message = absl::GetFlag(FLAGS_max_samples_per_message);
  options.max_samples_per_step = absl::GetFlag(FLAGS_max_samples_per_step);
  options.step_ttl = absl::GetFlag(FLAGS_step_ttl);
  options.cluster_etcd = absl::GetFlag(FLAGS_cluster_etcd);
  options.cluster_advertise = absl::GetFlag(FLAGS_cluster_advertise);
  options.cluster_name = absl::GetFlag(FLAGS_cluster_name);
  options.cluster_member_identity = absl::GetFlag(FLAGS_cluster_member_identity);
  options.cluster_etcd_ca = absl::GetFlag(FLAGS_cluster_etcd_ca);
  options.cluster_etcd_cert = absl::GetFlag(FLAGS_cluster_etcd_cert);
  options.cluster_etcd_key = absl::GetFlag(FLAGS_cluster_etcd_key);
  if (absl::GetFlag(FLAGS_shutdown_grace_seconds) < 0) {
    std::fprintf(stderr, "rollpackd: --shutdown-grace-seconds is %d, must be >= 0\n",
                 absl::GetFlag(FLAGS_shutdown_grace_seconds));
    return 2;
  }
  if (absl::GetFlag(FLAGS_cluster_lease_seconds) < 1) {
    std::fprintf(stderr, "rollpackd: --cluster-lease-seconds is %d, must be >= 1\n",
                 absl::GetFlag(FLAGS_cluster_lease_seconds));
    return 2;
  }
  options.cluster_lease_ttl = absl::Seconds(absl::GetFlag(FLAGS_cluster_lease_seconds));
  if (absl::GetFlag(FLAGS_cluster_expect_members) < 0) {
    std::fprintf(stderr, "rollpackd: --cluster-expect-members is %d, must be >= 0\n",
                 absl::GetFlag(FLAGS_cluster_expect_members));
    return 2;
  }
  if (!options.cluster_etcd.empty()) {
    // Mistakes that would form a working but wrong cluster
    // (server/cluster/cluster_config_check.h).
    if (absl::Status s = rollpack::CheckAdvertisable(options.listen, options.cluster_advertise);
        !s.ok()) {
      std::fprintf(stderr, "rollpackd: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    if (std::optional<std::string> warning = rollpack::LoopbackAdvertiseWarning(
            options.listen, options.cluster_advertise, options.cluster_etcd)) {
      spdlog::warn("rollpackd: {}", *warning);
    }
  }
  if (!options.auth_tokens_file.empty()) {
    struct stat st;
    if (stat(options.auth_tokens_file.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO))) {
      spdlog::warn("rollpackd: --auth-tokens {} is readable by group/others; chmod 600 it",
                   options.auth_tokens_file);
    }
  }
  absl::StatusOr<std::unique_ptr<rollpack::RollpackServer>> server =
      rollpack::RollpackServer::Start(options);
  if (!server.ok()) {
    spdlog::error("rollpackd: {}", server.status().ToString());
    return 1;
  }

  if (rollpack::DurableLog* log = (*server)->durable_log(); log != nullptr) {
    const rollpack::RecoveryInfo& r = (*server)->recovery();
    const rollpack::StoreStats stats = (*server)->store().Stats();
    spdlog::info("rollpackd: durable log {} (fsync {}): replayed {} records, {} bytes; "
                 "{} samples, {} live steps recovered",
                 log->path(), rollpack::FsyncPolicyName(log->options().fsync), r.records, r.bytes,
                 stats.num_samples, stats.num_live_steps);
    if (r.torn_tail_bytes > 0) {
      spdlog::warn("rollpackd: durable log: cut {} bytes off the end ({}); they are kept in {}",
                   r.torn_tail_bytes, r.cut_reason,
                   r.cut_file.empty() ? "no file (an incomplete file header)" : r.cut_file);
    }
    if (r.converted_from_v1) spdlog::info("rollpackd: durable log rewritten in format version 2");
    if (r.removed_compaction_file) {
      spdlog::warn("rollpackd: durable log: removed a half-written compaction (killed during it)");
    }
  }
  // The gRPC port's file last: once it exists, every port is serving.
  WritePortFile(absl::GetFlag(FLAGS_capture_port_file), (*server)->capture_port());
  WritePortFile(absl::GetFlag(FLAGS_metrics_port_file), (*server)->metrics_port());
  WritePortFile(absl::GetFlag(FLAGS_port_file), (*server)->port());
  if ((*server)->metrics_port() > 0) {
    spdlog::info("rollpackd: metrics on {} (port {})", options.metrics_listen,
                 (*server)->metrics_port());
  }
  spdlog::info("rollpackd: {}{}", options.tls_cert.empty() ? "plaintext gRPC" : "TLS",
               options.tls_client_ca.empty() ? "" : " with client certificates (mTLS)");
  if (!options.auth_tokens_file.empty()) spdlog::info("rollpackd: token auth on");
  std::unique_ptr<rollpack::MemberCountWatch> member_count_watch;
  if (rollpack::Cluster* cluster = (*server)->cluster(); cluster != nullptr) {
    spdlog::info("rollpackd: member {} of cluster \"{}\" (etcd {})", cluster->self().address,
                 cluster->options().name, absl::StrJoin(options.cluster_etcd, ","));
    if (const int expected = absl::GetFlag(FLAGS_cluster_expect_members); expected > 0) {
      member_count_watch = std::make_unique<rollpack::MemberCountWatch>(cluster, expected);
    }
  }
  spdlog::info("rollpackd listening on {} ({} on this host; max memory {} bytes)",
               absl::StrCat(options.listen.substr(0, options.listen.rfind(':')), ":",
                            (*server)->port()),
               (*server)->address(),
               (*server)->store().Stats().max_memory_bytes);
  int signal_number = 0;
  while (sigwait(&waited, &signal_number) == 0 && signal_number == SIGHUP) {
    absl::Status reloaded = (*server)->ReloadTokens();
    if (reloaded.ok()) {
      spdlog::info("rollpackd: SIGHUP: --auth-tokens re-read");
    } else {
      spdlog::error("rollpackd: SIGHUP: keeping the tokens held: {}", reloaded.ToString());
    }
  }
  member_count_watch.reset();  // before the cluster it reads goes
  spdlog::info("rollpackd: signal {} ({}), shutting down; a second signal exits at once",
               signal_number, strsignal(signal_number));
  // An operator who does not want to wait out the grace period sends the
  // signal again (a second Ctrl-C): exit without finishing the streams.
  // Durable state is safe: every acknowledged write is already in the log.
  std::thread([stop_signals] {
    int second = 0;
    sigwait(&stop_signals, &second);
    spdlog::warn("rollpackd: signal {} again: exiting now, streams in flight are cut", second);
    spdlog::default_logger()->flush();
    std::_Exit(128 + second);
  }).detach();
  // The grace period bounds the stop: a transport still draining a flood
  // of reset streams (HTTP/2 rapid reset) kept gRPC's shutdown waiting for
  // 30 s and more past it. Acknowledged writes are in the log already. The
  // watch ends once the server is gone (its log closed).
  const absl::Duration grace = absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds));
  auto stopped = std::make_shared<absl::Notification>();
  std::thread([grace, stopped] {
    if (stopped->WaitForNotificationWithTimeout(grace + kShutdownOverrun)) return;
    spdlog::error("rollpackd: not stopped {} after the signal (grace {} + {}): exiting now",
                  absl::FormatDuration(grace + kShutdownOverrun), absl::FormatDuration(grace),
                  absl::FormatDuration(kShutdownOverrun));
    spdlog::default_logger()->flush();
    std::_Exit(1);
  }).detach();
  const absl::Time start = absl::Now();
  (*server)->Shutdown(grace);
  server->reset();
  stopped->Notify();
  spdlog::info("rollpackd: stopped in {}",
               absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))));
  return 0;
}
