// The HTTP client side of `rollpack bench capture`: a blocking keep-alive
// connection for one request at a time (timed end to end, streams read
// chunk by chunk as they arrive), and a burst of requests each on a
// connection of its own, all in flight at once (Boost.Asio, one thread).
#ifndef ROLLPACK_CLI_BENCH_CAPTURE_CLIENT_H_
#define ROLLPACK_CLI_BENCH_CAPTURE_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rollpack {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// An HTTP/1.1 request's bytes (Host, Content-Length and keep-alive added).
std::string HttpRequestBytes(absl::string_view method, absl::string_view target,
                             const HttpHeaders& headers, absl::string_view body);

struct HttpAnswer {
  int status = 0;
  HttpHeaders headers;  // names lowercased
  int64_t body_bytes = 0;
  double seconds = 0;  // from the request's first byte written to the answer's last read
  // The value of header `name` (lowercase), "" when absent.
  std::string Header(absl::string_view name) const;
};

class HttpConnection {
 public:
  // A TCP_NODELAY connection to 127.0.0.1:`port`.
  static absl::StatusOr<std::unique_ptr<HttpConnection>> Connect(int port);
  ~HttpConnection();

  // Writes `request` and reads the whole answer (Content-Length, chunked,
  // or until the connection closes). `on_chunk`: each chunk of a chunked
  // body with the steady clock (ns) at which it was complete.
  using ChunkCallback = std::function<void(absl::string_view data, int64_t arrived_ns)>;
  absl::StatusOr<HttpAnswer> Exchange(absl::string_view request,
                                      const ChunkCallback& on_chunk = nullptr);
  // The last answer's body (valid until the next Exchange).
  absl::string_view body() const;

 private:
  explicit HttpConnection(int fd) : fd_(fd) {}
  absl::Status Fill();  // reads more into buffer_
  int fd_;
  std::string buffer_;  // bytes read but not consumed
  std::unique_ptr<char[]> body_;
  size_t body_capacity_ = 0;
  size_t body_size_ = 0;
  std::string chunked_body_;
  bool chunked_ = false;
  bool closed_ = false;
};

// `requests[i]` each on a new connection to 127.0.0.1:`port`, all started at
// once; waits for every answer (Content-Length framed) or `timeout`.
struct BurstOutcome {
  int sent = 0;
  int answered = 0;   // complete answers
  int status_ok = 0;  // of them, 200
  int stored = 0;     // of them, X-Rollpack-Capture: stored
  int64_t body_bytes = 0;
  std::vector<double> seconds;  // per answered request, from its write to its last byte
  std::string first_problem;    // a connection error or a status other than 200
};
BurstOutcome RunBurst(int port, const std::vector<std::string>& requests, absl::Duration timeout);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_CAPTURE_CLIENT_H_
