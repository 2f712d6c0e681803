// Serves a metrics Registry over HTTP for Prometheus: GET /metrics returns
// the text exposition format 0.0.4. Read-only: every other method gets 405,
// every other path 404. Uses cpp-httplib (Debian's libcpp-httplib-dev) on
// its own threads.
#ifndef ROLLPACK_SERVER_OPS_METRICS_HTTP_EXPORTER_H_
#define ROLLPACK_SERVER_OPS_METRICS_HTTP_EXPORTER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/ops/metrics/registry.h"

namespace httplib {
class Server;
}

namespace rollpack::metrics {

class HttpExporter {
 public:
  // Binds `listen` (host:port; port 0 picks a free one) and starts serving.
  // UNAVAILABLE when the address cannot be bound. `registry` must outlive
  // the exporter.
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(const std::string& listen,
                                                             const Registry* registry);
  ~HttpExporter();  // Stops and joins.
  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;

  int port() const { return port_; }
  void Stop();

 private:
  HttpExporter() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace rollpack::metrics

#endif  // ROLLPACK_SERVER_OPS_METRICS_HTTP_EXPORTER_H_
