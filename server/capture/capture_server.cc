#include "server/capture/capture_server.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/steady_timer.hpp"
#include "server/capture/capture_recorder.h"
#include "server/capture/proxy_connection.h"
#include "spdlog/spdlog.h"

namespace rollpack {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using capture_internal::Loop;
using capture_internal::ProxyContext;

namespace {

struct HostPort {
  std::string host;
  std::string port;
};

// "HOST:PORT" or "[V6]:PORT".
absl::StatusOr<HostPort> SplitHostPort(absl::string_view flag, absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " \"", address, "\" is not HOST:PORT"));
  }
  absl::string_view host = address.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  return HostPort{std::string(host), std::string(address.substr(colon + 1))};
}

absl::StatusOr<tcp::endpoint> Resolve(asio::io_context& context, absl::string_view flag,
                                      const HostPort& address) {
  tcp::resolver resolver(context);
  boost::system::error_code ec;
  auto results = resolver.resolve(address.host, address.port, ec);
  if (ec || results.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " host \"", address.host,
                                                   "\" does not resolve: ", ec.message()));
  }
  return results.begin()->endpoint();
}

}  // namespace

class CaptureServer::Impl {
 public:
  Impl(const CaptureOptions& options, SampleStore* store, ServerMetrics* metrics)
      : recorder_(store, metrics, options.engine, options.pool, options.keep_routing),
        record_budget_(options.record_memory_bytes),
        record_workers_(std::max(1, options.record_threads)) {
    const int loops = std::max(1, options.io_threads);
    for (int i = 0; i < loops; ++i) {
      contexts_.push_back(std::make_unique<asio::io_context>(1));
      loops_.push_back(std::make_unique<Loop>(*contexts_.back()));
    }
  }

  ~Impl() {
    boost::system::error_code ec;
    if (acceptor_ != nullptr) acceptor_->close(ec);
    for (auto& context : contexts_) context->stop();
    for (std::thread& thread : threads_) thread.join();
    // Queued captures finish and post their replies to stopped loops, whose
    // destruction then frees the connections (their sockets' loops still
    // exist at that point).
  }

  absl::Status Listen(const CaptureOptions& options, CaptureMetrics* capture_metrics,
                      const Authorizer* auth, AnnotateFunction annotate, IntakeCheck intake) {
    ASSIGN_OR_RETURN(HostPort listen, SplitHostPort("--capture-listen", options.listen));
    absl::string_view upstream = options.upstream;
    if (!absl::ConsumePrefix(&upstream, "http://")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--capture-upstream \"", options.upstream, "\" is not http://HOST:PORT"));
    }
    upstream = absl::StripSuffix(upstream, "/");
    ASSIGN_OR_RETURN(HostPort upstream_address, SplitHostPort("--capture-upstream", upstream));
    asio::io_context& first = *contexts_.front();
    ASSIGN_OR_RETURN(context_.upstream, Resolve(first, "--capture-upstream", upstream_address));
    ASSIGN_OR_RETURN(tcp::endpoint endpoint, Resolve(first, "--capture-listen", listen));
    context_.options = options;
    context_.upstream_name = options.upstream;
    context_.recorder = &recorder_;
    context_.record_workers = &record_workers_;
    context_.metrics = capture_metrics;
    context_.auth = auth;
    context_.log_limiter = &log_limiter_;
    context_.record_budget = &record_budget_;
    context_.annotate = std::move(annotate);
    context_.intake = std::move(intake);

    acceptor_ = std::make_unique<tcp::acceptor>(first);
    accept_backoff_ = std::make_unique<asio::steady_timer>(first);
    boost::system::error_code ec;
    acceptor_->open(endpoint.protocol(), ec);
    if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_->bind(endpoint, ec);
    if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("--capture-listen ", options.listen, ": ", ec.message()));
    }
    port_ = acceptor_->local_endpoint(ec).port();
    Accept();
    for (auto& context : contexts_) {
      threads_.emplace_back([&context] {
        auto work = asio::make_work_guard(*context);
        context->run();
      });
    }
    return absl::OkStatus();
  }

  int port() const { return port_; }

 private:
  // Connections go to the loops in turn; each stays on its loop.
  void Accept() {
    Loop* loop = loops_[next_loop_++ % loops_.size()].get();
    acceptor_->async_accept(loop->context, [this, loop](boost::system::error_code ec,
                                                        tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) {
        capture_internal::ServeConnection(&context_, loop, std::move(socket));
        return Accept();
      }
      // Out of descriptors, most likely: accepting again at once would
      // spin; connections closing meanwhile make room.
      int64_t dropped = 0;
      if (log_limiter_.Allow("accept", absl::Now(), &dropped)) {
        spdlog::warn("capture port: accept failed: {} ({} more not logged); retrying in 50 ms",
                     ec.message(), dropped);
      }
      accept_backoff_->expires_after(std::chrono::milliseconds(50));
      accept_backoff_->async_wait([this](boost::system::error_code wait) {
        if (!wait) Accept();
      });
    });
  }

  CaptureRecorder recorder_;
  LogRateLimiter log_limiter_{5, absl::Seconds(10)};
  RecordBudget record_budget_;
  ProxyContext context_;
  std::vector<std::unique_ptr<asio::io_context>> contexts_;
  std::vector<std::unique_ptr<Loop>> loops_;
  // Declared after the loops: destroyed (joined) first, so that a capture
  // still running posts its reply to a loop that exists.
  WorkerPool record_workers_;
  std::unique_ptr<tcp::acceptor> acceptor_;
  std::unique_ptr<asio::steady_timer> accept_backoff_;
  std::vector<std::thread> threads_;
  size_t next_loop_ = 0;
  int port_ = 0;
};

absl::StatusOr<std::unique_ptr<CaptureServer>> CaptureServer::Start(
    const CaptureOptions& options, SampleStore* store, ServerMetrics* metrics,
    CaptureMetrics* capture_metrics, const Authorizer* auth, AnnotateFunction annotate,
    IntakeCheck intake) {
  auto impl = std::make_unique<Impl>(options, store, metrics);
  RETURN_IF_ERROR(
      impl->Listen(options, capture_metrics, auth, std::move(annotate), std::move(intake)));
  return std::unique_ptr<CaptureServer>(new CaptureServer(std::move(impl)));
}

CaptureServer::CaptureServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CaptureServer::~CaptureServer() = default;

int CaptureServer::port() const { return impl_->port(); }

}  // namespace rollpack
