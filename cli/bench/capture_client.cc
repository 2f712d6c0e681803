#include "cli/bench/capture_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "boost/asio/buffer.hpp"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/read_until.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/write.hpp"
#include "cli/bench/capture_engine.h"

namespace rollpack {
namespace {

constexpr size_t kReadChunk = 256 * 1024;

// The status line and header fields of `head` (the bytes before the blank
// line). false when it is not an HTTP/1.x response.
bool ParseHead(absl::string_view head, HttpAnswer* answer, int64_t* content_length, bool* chunked) {
  *content_length = -1;
  *chunked = false;
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  if (lines.empty() || !absl::StartsWith(lines[0], "HTTP/1.")) return false;
  std::vector<absl::string_view> status = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status.size() < 2 || !absl::SimpleAtoi(status[1], &answer->status)) return false;
  answer->headers.clear();
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    if (name == "content-length") (void)absl::SimpleAtoi(value, content_length);
    if (name == "transfer-encoding" && absl::StrContains(absl::AsciiStrToLower(value), "chunked")) {
      *chunked = true;
    }
    answer->headers.emplace_back(std::move(name), std::move(value));
  }
  return true;
}

}  // namespace

std::string HttpRequestBytes(absl::string_view method, absl::string_view target,
                             const HttpHeaders& headers, absl::string_view body) {
  std::string out = absl::StrCat(method, " ", target, " HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  for (const auto& [name, value] : headers) absl::StrAppend(&out, name, ": ", value, "\r\n");
  if (!body.empty() || method == "POST") {
    absl::StrAppend(&out, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n");
  }
  absl::StrAppend(&out, "\r\n", body);
  return out;
}

std::string HttpAnswer::Header(absl::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return "";
}

// --- One connection, one request at a time ----------------------------------

absl::StatusOr<std::unique_ptr<HttpConnection>> HttpConnection::Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect to 127.0.0.1:", port, ": ", std::strerror(error)));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return std::unique_ptr<HttpConnection>(new HttpConnection(fd));
}

HttpConnection::~HttpConnection() { close(fd_); }

absl::Status HttpConnection::Fill() {
  const size_t at = buffer_.size();
  buffer_.resize(at + kReadChunk);
  ssize_t n;
  do {
    n = recv(fd_, buffer_.data() + at, kReadChunk, 0);
  } while (n < 0 && errno == EINTR);
  buffer_.resize(at + static_cast<size_t>(std::max<ssize_t>(n, 0)));
  if (n < 0) return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
  if (n == 0) {
    closed_ = true;
    return absl::UnavailableError("the server closed the connection");
  }
  return absl::OkStatus();
}

absl::StatusOr<HttpAnswer> HttpConnection::Exchange(absl::string_view request,
                                                    const ChunkCallback& on_chunk) {
  if (closed_) return absl::UnavailableError("the connection is closed");
  HttpAnswer answer;
  const int64_t start = SteadyNanos();
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    sent += static_cast<size_t>(n);
  }
  size_t head_end;
  while ((head_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (absl::Status s = Fill(); !s.ok()) return s;
  }
  int64_t length = -1;
  bool chunked = false;
  if (!ParseHead(absl::string_view(buffer_.data(), head_end), &answer, &length, &chunked)) {
    return absl::DataLossError("not an HTTP response");
  }
  buffer_.erase(0, head_end + 4);
  chunked_ = chunked;
  body_size_ = 0;
  chunked_body_.clear();
  if (chunked) {
    size_t at = 0;
    while (true) {
      size_t line_end;
      while ((line_end = buffer_.find("\r\n", at)) == std::string::npos) {
        if (absl::Status s = Fill(); !s.ok()) return s;
      }
      size_t size = 0;
      absl::string_view size_text(buffer_.data() + at, line_end - at);
      size_text = size_text.substr(0, size_text.find(';'));
      if (!absl::SimpleHexAtoi(size_text, &size)) return absl::DataLossError("bad chunk size");
      if (size == 0) {
        // Trailers, then the blank line.
        at = line_end + 2;
        while (true) {
          while ((line_end = buffer_.find("\r\n", at)) == std::string::npos) {
            if (absl::Status s = Fill(); !s.ok()) return s;
          }
          if (line_end == at) break;
          const absl::string_view line(buffer_.data() + at, line_end - at);
          const size_t colon = line.find(':');
          if (colon != absl::string_view::npos) {
            answer.headers.emplace_back(
                absl::AsciiStrToLower(line.substr(0, colon)),
                std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
          }
          at = line_end + 2;
        }
        buffer_.erase(0, line_end + 2);
        break;
      }
      while (buffer_.size() < line_end + 2 + size + 2) {
        if (absl::Status s = Fill(); !s.ok()) return s;
      }
      const absl::string_view data(buffer_.data() + line_end + 2, size);
      if (on_chunk) on_chunk(data, SteadyNanos());
      chunked_body_.append(data.data(), data.size());
      at = line_end + 2 + size + 2;
      if (at > (1 << 20)) {
        buffer_.erase(0, at);
        at = 0;
      }
    }
    answer.body_bytes = static_cast<int64_t>(chunked_body_.size());
  } else if (length >= 0) {
    const size_t want = static_cast<size_t>(length);
    if (body_capacity_ < want) {
      body_.reset(new char[want]);
      body_capacity_ = want;
    }
    const size_t have = std::min(want, buffer_.size());
    std::memcpy(body_.get(), buffer_.data(), have);
    buffer_.erase(0, have);
    for (size_t got = have; got < want;) {
      const ssize_t n = recv(fd_, body_.get() + got, want - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        closed_ = true;
        return absl::UnavailableError("the server closed the connection mid-body");
      }
      got += static_cast<size_t>(n);
    }
    body_size_ = want;
    answer.body_bytes = length;
  } else {
    // Framed by the end of the connection.
    while (Fill().ok()) {
    }
    chunked_ = true;
    chunked_body_ = std::move(buffer_);
    buffer_.clear();
    answer.body_bytes = static_cast<int64_t>(chunked_body_.size());
  }
  answer.seconds = static_cast<double>(SteadyNanos() - start) * 1e-9;
  return answer;
}

absl::string_view HttpConnection::body() const {
  return chunked_ ? absl::string_view(chunked_body_) : absl::string_view(body_.get(), body_size_);
}

// --- A burst: every request on its own connection, all at once ---------------

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct BurstState {
  asio::io_context io;
  tcp::endpoint endpoint;
  int pending = 0;
  BurstOutcome outcome;
  // Every connection reads its body here: one thread, and the bytes are
  // only counted.
  std::vector<char> scratch = std::vector<char>(kReadChunk);
  asio::steady_timer deadline{io};

  void Problem(const std::string& what) {
    if (outcome.first_problem.empty()) outcome.first_problem = what;
  }
  void Finished() {
    if (--pending == 0) deadline.cancel();
  }
};

class BurstExchange : public std::enable_shared_from_this<BurstExchange> {
 public:
  BurstExchange(BurstState* state, const std::string* request)
      : state_(state), request_(request), socket_(state->io) {}

  void Start() {
    socket_.async_connect(
        state_->endpoint, [self = shared_from_this()](boost::system::error_code ec) {
          if (ec) return self->Fail(absl::StrCat("connect: ", ec.message()));
          boost::system::error_code ignored;
          self->socket_.set_option(tcp::no_delay(true), ignored);
          self->start_ = SteadyNanos();
          asio::async_write(self->socket_, asio::buffer(*self->request_),
                            [self](boost::system::error_code ec, size_t) {
                              if (ec) return self->Fail(absl::StrCat("write: ", ec.message()));
                              self->ReadHead();
                            });
        });
  }

  void Cancel() {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

 private:
  void ReadHead() {
    asio::async_read_until(socket_, asio::dynamic_buffer(in_), "\r\n\r\n",
                           [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                             if (ec) return self->Fail(absl::StrCat("read: ", ec.message()));
                             int64_t length = -1;
                             bool chunked = false;
                             if (!ParseHead(absl::string_view(self->in_.data(), n - 4),
                                            &self->answer_, &length, &chunked) ||
                                 length < 0) {
                               return self->Fail("an answer without Content-Length");
                             }
                             self->left_ = length - static_cast<int64_t>(self->in_.size() - n);
                             self->length_ = length;
                             self->in_.clear();
                             self->ReadBody();
                           });
  }

  void ReadBody() {
    if (left_ <= 0) return Done();
    socket_.async_read_some(
        asio::buffer(state_->scratch.data(),
                     std::min<size_t>(state_->scratch.size(), static_cast<size_t>(left_))),
        [self = shared_from_this()](boost::system::error_code ec, size_t n) {
          if (ec) return self->Fail(absl::StrCat("read body: ", ec.message()));
          self->left_ -= static_cast<int64_t>(n);
          self->ReadBody();
        });
  }

  void Done() {
    BurstOutcome& out = state_->outcome;
    ++out.answered;
    out.seconds.push_back(static_cast<double>(SteadyNanos() - start_) * 1e-9);
    out.body_bytes += length_;
    if (answer_.status == 200) {
      ++out.status_ok;
    } else {
      state_->Problem(absl::StrCat("status ", answer_.status));
    }
    if (answer_.Header("x-rollpack-capture") == "stored") ++out.stored;
    Cancel();
    state_->Finished();
  }

  void Fail(const std::string& what) {
    state_->Problem(what);
    Cancel();
    state_->Finished();
  }

  BurstState* const state_;
  const std::string* const request_;
  tcp::socket socket_;
  std::string in_;
  HttpAnswer answer_;
  int64_t start_ = 0;
  int64_t left_ = 0;
  int64_t length_ = 0;
};

}  // namespace

BurstOutcome RunBurst(int port, const std::vector<std::string>& requests, absl::Duration timeout) {
  BurstState state;
  state.endpoint = tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port));
  std::vector<std::shared_ptr<BurstExchange>> exchanges;
  exchanges.reserve(requests.size());
  state.pending = static_cast<int>(requests.size());
  state.outcome.sent = static_cast<int>(requests.size());
  for (const std::string& r : requests) {
    exchanges.push_back(std::make_shared<BurstExchange>(&state, &r));
    exchanges.back()->Start();
  }
  state.deadline.expires_after(absl::ToChronoNanoseconds(timeout));
  state.deadline.async_wait([&](boost::system::error_code ec) {
    if (ec) return;
    state.Problem("timed out");
    for (auto& e : exchanges) e->Cancel();
  });
  state.io.run();
  return std::move(state.outcome);
}

}  // namespace rollpack
