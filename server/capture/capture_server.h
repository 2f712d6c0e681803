// The capture port (shared/spec/capture.md): an HTTP/1.1 reverse proxy in
// front of one inference server that stores every generation it forwards.
//
// Threads: `io_threads` event loops (Boost.Asio io_contexts, one thread
// each) hold the connections, any number per loop (2,000 open sessions cost
// about 8.5 KB each, docs/capture-design.md); parsing the engine's answer,
// decoding its routing, validating and storing run on `record_threads`
// workers so that a store's durable write never stalls a loop.
#ifndef ROLLPACK_SERVER_CAPTURE_CAPTURE_SERVER_H_
#define ROLLPACK_SERVER_CAPTURE_CAPTURE_SERVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "server/capture/capture_metrics.h"
#include "server/capture/capture_options.h"
#include "server/capture/rollpack_endpoints.h"
#include "server/ingest/intake_check.h"
#include "server/ops/auth.h"
#include "server/ops/server_metrics.h"
#include "server/store/sample_store.h"

namespace rollpack {

class CaptureServer {
 public:
  // Binds `options.listen` and starts serving. `store` and `auth` outlive
  // the server; `metrics` and `capture_metrics` may be null; `auth` may be
  // null (no auth). `annotate` serves POST /rollpack/v1/annotate (empty:
  // UNIMPLEMENTED). `intake` is asked before a generation request that
  // would be captured is forwarded: a refusal is answered 503 (a drained
  // cluster member), the engine never asked. INVALID_ARGUMENT for a
  // malformed listen or upstream address, UNAVAILABLE when the port cannot
  // be bound.
  static absl::StatusOr<std::unique_ptr<CaptureServer>> Start(
      const CaptureOptions& options, SampleStore* store, ServerMetrics* metrics,
      CaptureMetrics* capture_metrics, const Authorizer* auth, AnnotateFunction annotate = {},
      IntakeCheck intake = {});

  // Stops accepting, drops every connection and joins the threads.
  ~CaptureServer();

  CaptureServer(const CaptureServer&) = delete;
  CaptureServer& operator=(const CaptureServer&) = delete;

  int port() const;

  class Impl;

 private:
  explicit CaptureServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_CAPTURE_SERVER_H_
