// Serves a ScrapeRegistry to Prometheus over HTTP(S) with prometheus-cpp's
// pull Exposer (civetweb): GET /metrics is the text exposition format 0.0.4,
// gzip when the scraper asks for it.
//
// Read-only: a method other than GET is 405 on every path, GET / is a
// one-line index, any path but /metrics and / is 404. With basic auth, /metrics without
// valid credentials is 401.
//
// No HTTPS: Debian 12's civetweb loads libssl at run time through the
// OpenSSL 1.1 API, which OpenSSL 3 no longer exports (SSL_get_peer_certificate),
// so its TLS cannot start. Keep the endpoint on loopback or a private network
// (docs/operations.md).
#ifndef ROLLPACK_SERVER_OPS_METRICS_METRICS_ENDPOINT_H_
#define ROLLPACK_SERVER_OPS_METRICS_METRICS_ENDPOINT_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/ops/metrics/scrape_registry.h"

namespace prometheus {
class Exposer;
}

namespace rollpack::metrics {

struct MetricsEndpointOptions {
  // host:port; port 0 picks a free one; an empty host is every interface.
  std::string listen;
  // user -> password pairs Prometheus sends as HTTP basic auth; empty = none.
  std::vector<std::pair<std::string, std::string>> basic_auth;
};

// Reads a basic-auth file: one `user:password` per line; blank lines and
// lines starting with '#' are skipped. INVALID_ARGUMENT names the line that
// is malformed; NOT_FOUND when the file cannot be read.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadBasicAuthFile(
    const std::string& path);

class MetricsEndpoint {
 public:
  // Binds and starts serving `registry` (which must outlive the endpoint).
  // INVALID_ARGUMENT for a malformed address; UNAVAILABLE naming the address
  // and why when it cannot be bound (e.g. "address in use").
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const MetricsEndpointOptions& options, std::shared_ptr<ScrapeRegistry> registry);
  ~MetricsEndpoint();  // Stops serving and joins civetweb's threads.
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;

  std::shared_ptr<ScrapeRegistry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace rollpack::metrics

#endif  // ROLLPACK_SERVER_OPS_METRICS_METRICS_ENDPOINT_H_
