#include "server/capture/http_fields.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/ops/log_format.h"

namespace rollpack::capture_internal {

namespace asio = boost::asio;
namespace http = boost::beast::http;

bool IsHopByHop(absl::string_view name) {
  static constexpr absl::string_view kNames[] = {
      "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
      "proxy-authorization", "te", "trailer", "upgrade"};
  for (absl::string_view n : kNames) {
    if (absl::EqualsIgnoreCase(name, n)) return true;
  }
  return false;
}

bool IsFraming(absl::string_view name) {
  return absl::EqualsIgnoreCase(name, "content-length") ||
         absl::EqualsIgnoreCase(name, "transfer-encoding");
}

std::string HeaderValue(absl::string_view text) {
  std::string value(text);
  for (char& c : value) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return value;
}

std::string ErrorJson(absl::string_view type, absl::string_view message) {
  return absl::StrCat("{\"error\": {\"message\": \"", JsonEscape(message), "\", \"type\": \"",
                      type, "\"}}");
}

http::status HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return http::status::ok;
    case absl::StatusCode::kInvalidArgument:
      return http::status::bad_request;
    case absl::StatusCode::kUnauthenticated:
      return http::status::unauthorized;
    case absl::StatusCode::kPermissionDenied:
      return http::status::forbidden;
    case absl::StatusCode::kNotFound:
      return http::status::not_found;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return http::status::conflict;
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnavailable:
      return http::status::service_unavailable;
    case absl::StatusCode::kDeadlineExceeded:
      return http::status::gateway_timeout;
    default:
      return http::status::internal_server_error;
  }
}

bool ClosedWhileIdle(asio::ip::tcp::socket& socket) {
  char byte;
  boost::system::error_code ec;
  socket.non_blocking(true, ec);
  const size_t n = socket.receive(asio::buffer(&byte, 1), asio::ip::tcp::socket::message_peek, ec);
  socket.non_blocking(false, ec);
  return ec != asio::error::would_block || n > 0;
}

}  // namespace rollpack::capture_internal
