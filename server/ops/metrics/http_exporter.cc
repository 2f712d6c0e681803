#include "server/ops/metrics/http_exporter.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <cstdlib>
#include <sys/socket.h>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace rollpack::metrics {

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(const std::string& listen,
                                                                  const Registry* registry) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", listen, "\" is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";

  std::unique_ptr<HttpExporter> exporter(new HttpExporter());
  exporter->server_ = std::make_unique<httplib::Server>();
  httplib::Server& s = *exporter->server_;
  // A scrape is cheap; two workers are plenty and keep the sidecar small.
  s.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // httplib's default sets SO_REUSEPORT, which would let a second rollpackd
  // share the port silently; only SO_REUSEADDR (fast restarts).
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Serialize(), kTextContentType);
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("rollpackd metrics: GET /metrics\n", "text/plain");
  });
  const auto read_only = [](const httplib::Request&, httplib::Response& res) {
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_content("read-only: only GET /metrics\n", "text/plain");
  };
  s.Post(".*", read_only);
  s.Put(".*", read_only);
  s.Patch(".*", read_only);
  s.Delete(".*", read_only);

  if (port == 0) {
    port = s.bind_to_any_port(host);
    if (port <= 0) port = 0;
  } else if (!s.bind_to_port(host, port)) {
    port = 0;
  }
  if (port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", listen));
  }
  exporter->port_ = port;
  auto exited = std::make_shared<std::atomic<bool>>(false);
  exporter->thread_ = std::thread([&s, exited] {
    s.listen_after_bind();
    exited->store(true);
  });
  // stop() is a no-op before the loop runs: wait for it so Stop() can't hang.
  while (!s.is_running() && !exited->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return exporter;
}

void HttpExporter::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

HttpExporter::~HttpExporter() { Stop(); }

}  // namespace rollpack::metrics
