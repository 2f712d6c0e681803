// What the capture port does with an engine's answer to a generation
// request, between reading it and returning it (shared/spec/capture.md
// sections 2, 4 and 5): parse it, store each choice as a sample through the
// same validation and store as PutSamples, and make the client's body. It
// never touches the network: the proxy (capture_server.h) runs it on a
// worker thread and returns whatever it says.
#ifndef ROLLPACK_SERVER_CAPTURE_CAPTURE_RECORDER_H_
#define ROLLPACK_SERVER_CAPTURE_CAPTURE_RECORDER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/capture/capture_headers.h"
#include "server/capture/capture_sessions.h"
#include "server/capture/engine_exchange.h"
#include "server/ops/server_metrics.h"
#include "server/store/sample_store.h"

namespace rollpack {

// One generation request as the proxy forwarded it.
struct CapturedRequest {
  CaptureEndpoint endpoint;
  CaptureHeaders headers;
  ForwardedRequest forwarded;
  // A session's turn (section 6), admitted before forwarding; null for a
  // request without X-Rollpack-Session.
  std::shared_ptr<const SessionTurn> turn;
};

// What POST /rollpack/v1/sessions/S/finish answers.
struct SessionFinish {
  absl::Status status;
  std::string sample_id;
  int64_t tokens = 0;
};

struct CaptureOutcome {
  // The client's body; empty: the engine's bytes as they are (nothing to
  // strip, or the response could not be parsed).
  std::string client_body;
  bool body_changed = false;
  std::string pool;
  std::vector<std::string> sample_ids;  // stored, in choice order
  // OK: every choice was stored. Otherwise why not (some or all were not):
  // the text of `X-Rollpack-Capture: not-stored; ...` and of the log line.
  absl::Status status;
  int64_t stripped_bytes = 0;
  int64_t samples_stored = 0;  // new ones (identical re-sends excluded)
};

class CaptureRecorder {
 public:
  // `metrics` may be null. `store` and `metrics` outlive the recorder.
  CaptureRecorder(SampleStore* store, ServerMetrics* metrics, Engine engine,
                  std::string default_pool, bool keep_routing);

  CaptureSessions& sessions() const { return sessions_; }

  Engine engine() const { return engine_; }
  const std::string& default_pool() const { return default_pool_; }

  // The engine's 2xx answer `body` (followed by simdjson::SIMDJSON_PADDING
  // readable bytes) to `request`: its choices stored, and the client's body.
  CaptureOutcome Record(const CapturedRequest& request, absl::string_view body) const;

  // A streamed choice (stream_capture.h): choice `index` of the request's
  // choices, complete once its final event is in. Its client body is the
  // stream's business: only the store's outcome is filled in.
  CaptureOutcome RecordStreamed(const CapturedRequest& request, const EngineChoice& choice,
                                int64_t index, const std::string& response_id) const;

  // Seals the open session `session` of `pool` without a new turn, with
  // `scalars` when given (section 6). NOT_FOUND for an unknown session;
  // FAILED_PRECONDITION for one sealed or with a turn in flight, or scalars
  // that differ from those it has.
  SessionFinish FinishSession(const std::string& pool, const std::string& session,
                              const std::optional<std::map<std::string, double>>& scalars) const;

 private:
  // Stores `choices` (those from `first_index` of `total`) and fills in
  // `outcome`'s ids and status.
  void Store(const CapturedRequest& request, absl::Span<const EngineChoice> choices,
             int64_t first_index, int64_t total, const std::string& response_id,
             CaptureOutcome& outcome) const;

  SampleStore* const store_;
  ServerMetrics* const metrics_;
  const Engine engine_;
  const std::string default_pool_;
  const bool keep_routing_;
  mutable CaptureSessions sessions_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_CAPTURE_RECORDER_H_
