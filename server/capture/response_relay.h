// The engine's answer passed to the client as it arrives, never buffered
// whole (shared/spec/capture.md section 1): as the engine framed it, or, for
// a captured stream, event by event with the routing taken out, each choice
// stored before its final event goes on and the outcome sent as trailers
// (section 4). Internal to the proxy (proxy_connection.cc).
#ifndef ROLLPACK_SERVER_CAPTURE_RESPONSE_RELAY_H_
#define ROLLPACK_SERVER_CAPTURE_RESPONSE_RELAY_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "base/worker_pool.h"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/tcp_stream.hpp"
#include "boost/beast/http/empty_body.hpp"
#include "boost/beast/http/parser.hpp"
#include "server/capture/capture_recorder.h"
#include "server/capture/stream_capture.h"

namespace rollpack::capture_internal {

// The two sides of one exchange, owned by the connection, which outlives
// the relay (its `done` callback holds the connection).
struct RelayStreams {
  boost::beast::tcp_stream& client;
  boost::beast::tcp_stream& upstream;
  boost::beast::flat_buffer& upstream_buffer;
  absl::Duration timeout;
};

struct RelayEnd {
  // The whole answer reached the client, whose connection may carry its
  // next request; false: close it (either side broke off, or the answer
  // was framed by the end of the connection, or the client asked).
  bool client_reusable = false;
  // The engine's connection is at a message boundary and keeps alive.
  bool upstream_reusable = false;
  // A captured stream's outcome (sample ids, why some were not stored).
  CaptureOutcome outcome;
  // A captured stream's own time: from each read that completed final
  // events to the last of them going on (their parse, strip and store),
  // the reads' spans summed. The engine's time between events is not in it.
  double own_seconds = 0;
};

using RelayDone = std::function<void(RelayEnd)>;

// The body as the engine framed it. `header`: the engine's response
// header, read; its hop-by-hop fields are dropped and `edit` may add
// fields; `keep_alive` is what the client's connection asks.
void RelayAsFramed(RelayStreams streams,
                   boost::beast::http::response_parser<boost::beast::http::empty_body>&& header,
                   bool keep_alive,
                   const std::function<void(boost::beast::http::fields&)>& edit,
                   RelayDone done);

// A captured stream (vLLM /inference/v1/generate, SGLang /generate with
// "stream": true), re-framed as chunks with X-Rollpack-Sample-Ids and
// X-Rollpack-Capture trailers. Each choice is recorded on `workers`.
void RelayCapturedStream(RelayStreams streams,
                         boost::beast::http::response_parser<boost::beast::http::empty_body>&&
                             header,
                         bool keep_alive, const CaptureRecorder* recorder,
                         WorkerPool* workers, CapturedRequest request, bool keep_routing,
                         RelayDone done);

}  // namespace rollpack::capture_internal

#endif  // ROLLPACK_SERVER_CAPTURE_RESPONSE_RELAY_H_
