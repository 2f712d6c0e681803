// HTTP/1.1 header rules the capture port's proxy applies (RFC 9110), and
// its own answers' shapes, apart from the connection that moves the bytes.
#ifndef ROLLPACK_SERVER_CAPTURE_HTTP_FIELDS_H_
#define ROLLPACK_SERVER_CAPTURE_HTTP_FIELDS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/http/status.hpp"

namespace rollpack::capture_internal {

// Headers that describe one hop, not the message (RFC 9110 section 7.6.1):
// never forwarded. Content-Length and Transfer-Encoding are framing
// (IsFraming): kept where a body is relayed as it was framed, recomputed
// where it is rewritten.
bool IsHopByHop(absl::string_view name);
bool IsFraming(absl::string_view name);

// `text` without the bytes HTTP forbids in a header value.
std::string HeaderValue(absl::string_view text);

// {"error": {"message": ..., "type": ...}}, the engines' error shape.
std::string ErrorJson(absl::string_view type, absl::string_view message);

// The HTTP status a capture port's own call answers for `code`.
boost::beast::http::status HttpStatusOf(absl::StatusCode code);

// True when the peer of an idle keep-alive connection has closed it (or
// sent bytes an idle connection must not have).
bool ClosedWhileIdle(boost::asio::ip::tcp::socket& socket);

}  // namespace rollpack::capture_internal

#endif  // ROLLPACK_SERVER_CAPTURE_HTTP_FIELDS_H_
