// An engine answer to be captured that has no Content-Length (chunked, or
// up to the end of the connection), read whole for the record workers and
// charged to the record budget (record_budget.h) as it arrives: an answer
// of known length is charged before it is read, and this one may not get
// past the bound by coming in pieces. Internal to the proxy
// (proxy_connection.cc).
#ifndef ROLLPACK_SERVER_CAPTURE_CHUNKED_ANSWER_H_
#define ROLLPACK_SERVER_CAPTURE_CHUNKED_ANSWER_H_

#include <cstdint>
#include <functional>

#include "absl/time/time.h"
#include "boost/beast/core/error.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/tcp_stream.hpp"
#include "boost/beast/http/parser.hpp"
#include "boost/beast/http/string_body.hpp"
#include "server/capture/record_budget.h"

namespace rollpack::capture_internal {

// Everything the read touches; owned by the connection, which outlives
// the read (`done` holds it).
struct ChunkedAnswerRead {
  boost::beast::tcp_stream& upstream;
  boost::beast::flat_buffer& buffer;
  // Its header read; the body goes into it.
  boost::beast::http::response_parser<boost::beast::http::string_body>& parser;
  RecordBudget& budget;
  // The bytes the connection holds in `budget`, grown here as the body
  // grows, released by the connection (also when the read fails).
  int64_t& charged;
  absl::Duration timeout;  // between reads
};

// Reads the body to its end, charging each piece that arrived before the
// next read (waiting while the budget is spent), then `done` on the
// upstream's executor with the read's error, if any.
void ReadChunkedAnswer(ChunkedAnswerRead read,
                       std::function<void(boost::beast::error_code)> done);

}  // namespace rollpack::capture_internal

#endif  // ROLLPACK_SERVER_CAPTURE_CHUNKED_ANSWER_H_
