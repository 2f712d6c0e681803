// One client connection of the capture port: reads its requests one after
// another (HTTP/1.1 keep-alive), forwards each to the engine over a pooled
// upstream connection, and returns the engine's answer, captured
// (capture_recorder.h) or relayed as it arrives. Internal to
// capture_server.cc; here so the exchange and the listener stay apart.
#ifndef ROLLPACK_SERVER_CAPTURE_PROXY_CONNECTION_H_
#define ROLLPACK_SERVER_CAPTURE_PROXY_CONNECTION_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/worker_pool.h"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/tcp_stream.hpp"
#include "server/capture/capture_metrics.h"
#include "server/capture/capture_options.h"
#include "server/capture/capture_recorder.h"
#include "server/capture/record_budget.h"
#include "server/capture/rollpack_endpoints.h"
#include "server/ingest/intake_check.h"
#include "server/ops/auth.h"
#include "server/ops/log_rate_limiter.h"

namespace rollpack::capture_internal {

// A keep-alive connection to the engine, reused by the next request of any
// client of the same loop.
struct UpstreamConnection {
  explicit UpstreamConnection(boost::asio::io_context& loop) : stream(loop) {}
  boost::beast::tcp_stream stream;
  boost::beast::flat_buffer buffer;
};

struct IdleUpstream {
  std::unique_ptr<UpstreamConnection> connection;
  std::chrono::steady_clock::time_point since;
};

// What one event loop's connections share. Touched only by its thread.
struct Loop {
  explicit Loop(boost::asio::io_context& context) : context(context) {}
  boost::asio::io_context& context;
  std::vector<IdleUpstream> idle_upstreams;
};

// What every connection shares; immutable while the server runs.
struct ProxyContext {
  CaptureOptions options;
  boost::asio::ip::tcp::endpoint upstream;
  std::string upstream_name;  // "http://HOST:PORT", for errors
  const CaptureRecorder* recorder = nullptr;
  WorkerPool* record_workers = nullptr;
  CaptureMetrics* metrics = nullptr;  // may be null
  const Authorizer* auth = nullptr;   // may be null
  LogRateLimiter* log_limiter = nullptr;  // may be null: every warning logged
  RecordBudget* record_budget = nullptr;
  AnnotateFunction annotate;  // may be empty
  IntakeCheck intake;         // may be empty: always OK
};

// Serves `socket` (accepted on `loop`) until the client or the server ends it.
void ServeConnection(const ProxyContext* context, Loop* loop,
                     boost::asio::ip::tcp::socket socket);

}  // namespace rollpack::capture_internal

#endif  // ROLLPACK_SERVER_CAPTURE_PROXY_CONNECTION_H_
