#include "server/capture/proxy_connection.h"

#include <chrono>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/strings/strip.h"
#include "boost/asio/post.hpp"
#include "boost/asio/read.hpp"
#include "boost/beast/http.hpp"
#include "server/capture/chunked_answer.h"
#include "server/capture/http_fields.h"
#include "server/capture/response_relay.h"
#include "server/capture/rollpack_endpoints.h"
#include "server/ops/log_format.h"
#include "simdjson.h"
#include "spdlog/spdlog.h"

namespace rollpack::capture_internal {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kHeaderLimit = 64 * 1024;
// Beast 1.74 compares a Content-Length with an unset (boost::none) body
// limit as exceeding it: "no limit" is spelled as the largest one.
constexpr uint64_t kNoBodyLimit = std::numeric_limits<uint64_t>::max();
// Idle upstream connections kept per loop, and how long one may idle: the
// engines' servers (uvicorn) close a keep-alive connection after 5 s idle,
// and a request written into one being closed would be lost.
constexpr size_t kMaxIdleUpstreams = 1024;
constexpr auto kMaxUpstreamIdle = std::chrono::seconds(3);
constexpr absl::string_view kPutMethod = "/rollpack.v1.Rollouts/PutSamples";

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

absl::string_view View(beast::string_view s) { return absl::string_view(s.data(), s.size()); }

class ProxyConnection : public std::enable_shared_from_this<ProxyConnection> {
 public:
  ProxyConnection(const ProxyContext* context, Loop* loop, tcp::socket socket)
      : context_(context), loop_(loop), client_(std::move(socket)) {
    beast::error_code ec;
    client_.socket().set_option(tcp::no_delay(true), ec);
    peer_ = absl::StrCat(client_.socket().remote_endpoint(ec).address().to_string(ec), ":",
                         client_.socket().remote_endpoint(ec).port());
  }

  ~ProxyConnection() { ReleaseRecordBytes(); }

  void Start() { ReadRequest(); }

 private:
  // --- The client's request -----------------------------------------------

  void ReadRequest() {
    request_parser_.emplace();
    request_parser_->header_limit(kHeaderLimit);
    request_parser_->body_limit(static_cast<uint64_t>(context_->options.max_body_bytes));
    client_.expires_after(ToChrono(context_->options.timeout));
    http::async_read_header(client_, client_buffer_, *request_parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              self->OnRequestHeader(ec);
                            });
  }

  void OnRequestHeader(beast::error_code ec) {
    if (ec) return OnRequestError(ec);
    const auto& header = request_parser_->get();
    if (absl::EqualsIgnoreCase(std::string(header[http::field::expect]), "100-continue")) {
      // curl and others wait for this before sending a body over 1 KB.
      auto continue_response = std::make_shared<http::response<http::empty_body>>(
          http::status::continue_, header.version());
      http::async_write(client_, *continue_response,
                        [self = shared_from_this(), continue_response](beast::error_code ec,
                                                                       size_t) {
                          if (ec) return self->Close();
                          self->ReadRequestBody();
                        });
      return;
    }
    ReadRequestBody();
  }

  void ReadRequestBody() {
    http::async_read(client_, client_buffer_, *request_parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->OnRequestError(ec);
                       self->request_ = self->request_parser_->release();
                       self->request_parser_.reset();
                       self->HandleRequest();
                     });
  }

  void OnRequestError(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      return ReplyError(http::status::payload_too_large, "rollpack_request",
                        absl::StrCat("the request body is larger than "
                                     "--capture-max-body-bytes = ",
                                     context_->options.max_body_bytes),
                        /*close=*/true);
    }
    if (ec == http::error::header_limit) {
      return ReplyError(http::status::request_header_fields_too_large, "rollpack_request",
                        absl::StrCat("the request's header is larger than ", kHeaderLimit,
                                     " bytes"),
                        /*close=*/true);
    }
    if (ec.category() == beast::error_code(http::error::bad_method).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      return ReplyError(http::status::bad_request, "rollpack_request",
                        absl::StrCat("malformed HTTP request: ", ec.message()), /*close=*/true);
    }
    Close();  // the client went away, or idled past the timeout
  }

  void HandleRequest() {
    start_ = Clock::now();
    client_keep_alive_ = request_.keep_alive();
    capture_ = false;
    capture_problem_ = absl::OkStatus();
    endpoint_.reset();
    passthrough_stream_ = false;
    retried_ = false;
    turn_.reset();

    std::vector<HeaderField> fields;
    for (const auto& field : request_) {
      fields.emplace_back(absl::string_view(field.name_string().data(), field.name_string().size()),
                          absl::string_view(field.value().data(), field.value().size()));
    }
    if (context_->auth != nullptr && context_->auth->enabled()) {
      std::string token;
      for (const auto& [name, value] : fields) {
        if (absl::EqualsIgnoreCase(name, "x-rollpack-token")) {
          token = std::string(absl::StripAsciiWhitespace(value));
        }
      }
      const grpc::Status allowed = context_->auth->CheckHeader(
          token.empty() ? "" : absl::StrCat("Bearer ", token), std::string(kPutMethod));
      if (allowed.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        return ReplyError(http::status::unauthorized, "rollpack_auth",
                          token.empty() ? "missing X-Rollpack-Token" : "unknown X-Rollpack-Token",
                          !client_keep_alive_);
      }
      if (!allowed.ok()) {
        return ReplyError(http::status::forbidden, "rollpack_auth",
                          "the X-Rollpack-Token's role may not put samples", !client_keep_alive_);
      }
    }
    absl::StatusOr<CaptureHeaders> headers = ParseCaptureHeaders(fields);
    if (!headers.ok()) {
      return ReplyError(http::status::bad_request, "rollpack_request",
                        headers.status().message(), !client_keep_alive_);
    }
    headers_ = *std::move(headers);

    const absl::string_view target(request_.target().data(), request_.target().size());
    if (absl::StartsWith(target, "/rollpack/")) return ServeRollpackEndpoint(target);
    endpoint_ = CapturedEndpoint(context_->recorder->engine(),
                                 absl::string_view(request_.method_string().data(),
                                                   request_.method_string().size()),
                                 target);
    if (endpoint_.has_value() && context_->intake) {
      // A drained member: the client retries on another member's port
      // rather than have the engine generate what would not be stored.
      if (absl::Status accepts = context_->intake(); !accepts.ok()) {
        return ReplyError(http::status::service_unavailable, "rollpack_drained",
                          accepts.message(), !client_keep_alive_);
      }
    }
    std::string forwarded_body;
    if (endpoint_.has_value()) PrepareCapture(&forwarded_body);

    upstream_request_ = {};
    upstream_request_.method_string(request_.method_string());
    upstream_request_.target(request_.target());
    upstream_request_.version(11);
    for (const auto& field : request_) {
      const auto name = field.name_string();
      if (IsHopByHop(View(name)) || IsFraming(View(name)) || field.name() == http::field::expect ||
          IsCaptureHeader(absl::string_view(name.data(), name.size()))) {
        continue;
      }
      upstream_request_.insert(name, field.value());
    }
    upstream_request_.body() = capture_ ? std::move(forwarded_body) : std::move(request_.body());
    upstream_request_.keep_alive(true);
    upstream_request_.prepare_payload();
    Forward();
  }

  // Decides whether this generation request is captured, and the body the
  // engine gets.
  void PrepareCapture(std::string* forwarded_body) {
    absl::StatusOr<ForwardedRequest> forwarded =
        ForwardRequest(*endpoint_, request_.body(), /*start_offset=*/0);
    if (!forwarded.ok()) {
      capture_problem_ = absl::Status(forwarded.status().code(),
                                      absl::StrCat("the request: ", forwarded.status().message()));
      return;
    }
    if (forwarded->streaming && *endpoint_ != CaptureEndpoint::kVllmGenerate &&
        *endpoint_ != CaptureEndpoint::kSglangGenerate) {
      // OpenAI streams carry no routing in either engine (section 3).
      passthrough_stream_ = true;
      return;
    }
    if (headers_.session.has_value()) {
      const std::string& session = *headers_.session;
      if (forwarded->choices_asked != 1) {
        capture_problem_ = absl::InvalidArgumentError(absl::StrCat(
            "session ", session, ": a session has one choice, the request asks for ",
            forwarded->choices_asked));
        return;
      }
      absl::StatusOr<std::unique_ptr<SessionTurn>> turn = context_->recorder->sessions().Begin(
          headers_.pool.value_or(context_->recorder->default_pool()), session);
      if (!turn.ok()) {
        capture_problem_ = turn.status();
        return;
      }
      // Known from the request: a rewritten history is forwarded as sent,
      // without a start offset.
      if (forwarded->request_prompt_ids.size() == 1) {
        if (std::optional<int64_t> at = CaptureSessions::PromptDiffers(
                (*turn)->stored_tokens(), forwarded->request_prompt_ids[0]);
            at.has_value()) {
          capture_problem_ = absl::FailedPreconditionError(absl::StrCat(
              "session ", session, ": prompt differs from the stored tokens at position ", *at));
          return;
        }
      }
      if ((*turn)->start_offset() > 0) {
        forwarded = ForwardRequest(*endpoint_, request_.body(), (*turn)->start_offset());
        if (!forwarded.ok()) {
          capture_problem_ = forwarded.status();
          return;
        }
      }
      turn_ = *std::move(turn);
    }
    forwarded_ = *std::move(forwarded);
    *forwarded_body = std::move(forwarded_.body);
    forwarded_.body.clear();
    capture_ = true;
  }

  // The capture port's own endpoints (rollpack_endpoints.h): they write
  // durably, so a record worker answers them, not this loop.
  void ServeRollpackEndpoint(absl::string_view target) {
    // Copied here, on the loop: the worker never touches the connection.
    context_->record_workers->Schedule([self = shared_from_this(), target = std::string(target),
                                        method = std::string(request_.method_string()),
                                        body = std::move(request_.body()), headers = headers_] {
      EndpointReply reply = rollpack::ServeRollpackEndpoint(
          *self->context_->recorder, self->context_->annotate, method, target, body, headers);
      asio::post(self->client_.get_executor(),
                 [self, reply = std::move(reply)] { self->ReplyRollpack(reply); });
    });
  }

  void ReplyRollpack(const EndpointReply& reply) {
    if (!reply.status.ok()) {
      spdlog::info("capture {}: {}", reply.summary, reply.status.ToString());
      return ReplyError(HttpStatusOf(reply.status.code()), reply.error_type,
                        reply.status.ToString(), !client_keep_alive_);
    }
    spdlog::info("capture {}", reply.summary);
    auto response = std::make_shared<http::response<http::string_body>>(http::status::ok, 11);
    response->set(http::field::content_type, "application/json");
    response->body() = reply.body;
    response->keep_alive(client_keep_alive_);
    response->prepare_payload();
    WriteResponse(std::move(response), !client_keep_alive_);
  }

  // --- The engine ----------------------------------------------------------

  void Forward() {
    upstream_start_ = Clock::now();
    while (!loop_->idle_upstreams.empty()) {
      IdleUpstream idle = std::move(loop_->idle_upstreams.back());
      loop_->idle_upstreams.pop_back();
      if (Clock::now() - idle.since < kMaxUpstreamIdle &&
          !ClosedWhileIdle(idle.connection->stream.socket())) {
        upstream_ = std::move(idle.connection);
        upstream_reused_ = true;
        return WriteUpstream();
      }
    }
    ConnectUpstream();
  }

  void ConnectUpstream() {
    upstream_ = std::make_unique<UpstreamConnection>(loop_->context);
    upstream_reused_ = false;
    upstream_->stream.expires_after(ToChrono(context_->options.timeout));
    upstream_->stream.async_connect(context_->upstream,
                                    [self = shared_from_this()](beast::error_code ec) {
                                      if (ec) return self->UpstreamFailed(ec, "connecting to");
                                      beast::error_code ignored;
                                      self->upstream_->stream.socket().set_option(
                                          tcp::no_delay(true), ignored);
                                      self->WriteUpstream();
                                    });
  }

  void WriteUpstream() {
    upstream_->stream.expires_after(ToChrono(context_->options.timeout));
    http::async_write(upstream_->stream, upstream_request_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->RetryOrFail(ec, "writing to");
                        self->ReadUpstreamHeader();
                      });
  }

  void ReadUpstreamHeader() {
    header_parser_.emplace();
    header_parser_->header_limit(kHeaderLimit);
    header_parser_->body_limit(kNoBodyLimit);
    if (request_.method() == http::verb::head) header_parser_->skip(true);
    upstream_->stream.expires_after(ToChrono(context_->options.timeout));
    http::async_read_header(upstream_->stream, upstream_->buffer, *header_parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t bytes) {
                              if (ec && bytes == 0) return self->RetryOrFail(ec, "reading from");
                              if (ec) return self->UpstreamFailed(ec, "reading from");
                              self->OnUpstreamHeader();
                            });
  }

  // A reused keep-alive connection the engine closed as the request went
  // out: the engine never read the request, so it is sent once more on a
  // fresh connection.
  void RetryOrFail(beast::error_code ec, const char* during) {
    if (upstream_reused_ && !retried_ &&
        (ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe)) {
      retried_ = true;
      upstream_.reset();
      return ConnectUpstream();
    }
    UpstreamFailed(ec, during);
  }

  void UpstreamFailed(beast::error_code ec, const char* during) {
    turn_.reset();
    ReleaseRecordBytes();
    upstream_.reset();
    const bool timed_out = ec == beast::error::timeout;
    const std::string message =
        absl::StrCat(timed_out ? "timed out " : "failed ", during, " the engine at ",
                     context_->upstream_name, ": ", ec.message());
    Count(CaptureResult::kUpstreamError);
    Log(/*problem=*/true, "upstream_error",
        absl::StrCat("capture ", View(request_.method_string()), " ", View(request_.target()),
                     " peer=", peer_, " result=upstream_error: ", message));
    ReplyError(timed_out ? http::status::gateway_timeout : http::status::bad_gateway,
               "rollpack_upstream", message, !client_keep_alive_, /*count=*/false);
  }

  void OnUpstreamHeader() {
    const auto& header = header_parser_->get();
    const unsigned status = header.result_int();
    if (!capture_) return StartRelay();
    if (status < 200 || status >= 300) {
      capture_ = false;
      capture_problem_ = absl::UnavailableError(
          absl::StrCat("the engine answered status ", status));
      return StartRelay();
    }
    if (forwarded_.streaming) return StartCapturedStream();
    const auto length = header_parser_->content_length();
    if (length.has_value() &&
        *length > static_cast<uint64_t>(context_->options.max_body_bytes)) {
      capture_ = false;
      capture_problem_ = absl::ResourceExhaustedError(
          absl::StrCat("the engine's response has ", *length,
                       " bytes, more than --capture-max-body-bytes = ",
                       context_->options.max_body_bytes));
      return StartRelay();
    }
    if (header_parser_->is_done()) {
      upstream_keep_alive_ = header_parser_->get().keep_alive();
      body_.assign(simdjson::SIMDJSON_PADDING, '\0');
      body_size_ = 0;
      return OnBodyRead();
    }
    if (length.has_value()) {
      // Waits while the record workers hold too many answers already.
      context_->record_budget->Acquire(
          static_cast<int64_t>(*length), [self = shared_from_this(), length = *length] {
            asio::post(self->client_.get_executor(), [self, length] {
              self->record_bytes_ = static_cast<int64_t>(length);
              self->ReadSizedBody(length);
            });
          });
      return;
    }
    ReadChunkedBody();
  }

  // A Content-Length body straight into a buffer of its size plus the
  // parser's padding: Beast's parser reads 64 KB per call (an 8 MB body took
  // 42 ms that way, 3 ms this way; docs/capture-design.md).
  void ReadSizedBody(uint64_t length) {
    body_size_ = length;
    body_.resize(length + simdjson::SIMDJSON_PADDING);
    auto buffered = upstream_->buffer.data();
    const size_t have = std::min<size_t>(asio::buffer_size(buffered), length);
    asio::buffer_copy(asio::buffer(body_.data(), have), buffered);
    upstream_->buffer.consume(have);
    upstream_keep_alive_ = header_parser_->get().keep_alive();
    if (have == length) return OnBodyRead();
    upstream_->stream.expires_after(ToChrono(context_->options.timeout));
    asio::async_read(upstream_->stream, asio::buffer(body_.data() + have, length - have),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->UpstreamFailed(ec, "reading from");
                       self->OnBodyRead();
                     });
  }

  void ReadChunkedBody() {
    string_parser_.emplace(std::move(*header_parser_));
    header_parser_.reset();
    string_parser_->body_limit(kNoBodyLimit);
    ReadChunkedAnswer({upstream_->stream, upstream_->buffer, *string_parser_,
                       *context_->record_budget, record_bytes_, context_->options.timeout},
                      [self = shared_from_this()](beast::error_code ec) {
                        if (ec) return self->UpstreamFailed(ec, "reading from");
                        self->upstream_keep_alive_ = self->string_parser_->get().keep_alive();
                        self->body_ = std::move(self->string_parser_->get().body());
                        self->body_size_ = self->body_.size();
                        self->body_.append(simdjson::SIMDJSON_PADDING, '\0');
                        self->OnBodyRead();
                      });
  }

  void OnBodyRead() {
    upstream_end_ = Clock::now();
    // The engine's header, kept to answer the client with.
    response_header_ = string_parser_.has_value()
                           ? http::response_header<>(string_parser_->get().base())
                           : http::response_header<>(header_parser_->get().base());
    string_parser_.reset();
    header_parser_.reset();
    ReleaseUpstream(upstream_keep_alive_);
    if (body_size_ > static_cast<uint64_t>(context_->options.max_body_bytes)) {
      CaptureOutcome outcome;
      outcome.status = absl::ResourceExhaustedError(
          absl::StrCat("the engine's response has ", body_size_,
                       " bytes, more than --capture-max-body-bytes = ",
                       context_->options.max_body_bytes));
      return ReplyCaptured(std::move(outcome));
    }
    CapturedRequest captured{*endpoint_, headers_, forwarded_, turn_};
    context_->record_workers->Schedule([self = shared_from_this(),
                                        captured = std::move(captured)]() mutable {
      CaptureOutcome outcome = self->context_->recorder->Record(
          captured, absl::string_view(self->body_.data(), self->body_size_));
      // The session's next turn may come as soon as the reply is out.
      captured.turn.reset();
      asio::post(self->client_.get_executor(),
                 [self, outcome = std::move(outcome)]() mutable {
                   self->ReplyCaptured(std::move(outcome));
                 });
    });
  }

  void ReplyCaptured(CaptureOutcome outcome) {
    turn_.reset();
    ReleaseRecordBytes();
    auto response = std::make_shared<http::response<http::string_body>>();
    response->base() = response_header_;
    for (auto it = response->begin(); it != response->end();) {
      const absl::string_view name = View(it->name_string());
      it = IsHopByHop(name) || IsFraming(name) ? response->erase(it) : std::next(it);
    }
    if (outcome.body_changed) {
      response->body() = std::move(outcome.client_body);
    } else {
      response->body().assign(body_.data(), body_size_);
    }
    body_.clear();
    body_.shrink_to_fit();
    if (!outcome.sample_ids.empty()) {
      response->set("X-Rollpack-Sample-Ids", absl::StrJoin(outcome.sample_ids, ","));
    }
    const bool stored = outcome.status.ok();
    response->set("X-Rollpack-Capture",
                  stored ? std::string("stored")
                         : HeaderValue(absl::StrCat("not-stored; ", outcome.status.ToString())));
    response->keep_alive(client_keep_alive_);
    response->prepare_payload();

    Report(outcome);
    WriteResponse(std::move(response), !client_keep_alive_);
  }

  // Metrics and the log line of a captured request. A stream's engine
  // time runs to its last event: its own time is the rewrite before
  // forwarding and what the relay counted (RelayEnd::own_seconds).
  void Report(const CaptureOutcome& outcome, std::optional<double> stream_own = std::nullopt) {
    const bool stored = outcome.status.ok();
    const double upstream_seconds = Seconds(upstream_end_ - upstream_start_);
    const double overhead_seconds =
        stream_own.has_value() ? Seconds(upstream_start_ - start_) + *stream_own
                               : Seconds(Clock::now() - start_) - upstream_seconds;
    Count(stored ? CaptureResult::kStored : CaptureResult::kNotStored);
    if (context_->metrics != nullptr) {
      context_->metrics->OnStored(outcome.samples_stored, outcome.stripped_bytes);
      context_->metrics->OnTimes(stream_own.has_value() ? CaptureMode::kStream
                                                        : CaptureMode::kBody,
                                 upstream_seconds, overhead_seconds);
    }
    Log(!stored, absl::StatusCodeToString(outcome.status.code()),
        absl::StrFormat("capture %s %s peer=%s pool=%s samples=[%s] result=%s engine=%.1fms "
                        "overhead=%.2fms",
                        View(request_.method_string()), View(request_.target()), peer_,
                        outcome.pool, absl::StrJoin(outcome.sample_ids, ","),
                        stored ? "stored" : absl::StrCat("not-stored: ", outcome.status.ToString()),
                        upstream_seconds * 1e3, overhead_seconds * 1e3));
  }

  // A captured request's log line: at debug when it went as it should (a
  // data call, like the gRPC call log's), a warning otherwise, at most a few
  // per kind of problem every 10 s so that a misconfigured engine or a
  // client retrying in a loop does not flood the log.
  void Log(bool problem, absl::string_view kind, const std::string& line) {
    if (!problem) {
      spdlog::debug("{}", line);
      return;
    }
    int64_t dropped = 0;
    if (context_->log_limiter != nullptr &&
        !context_->log_limiter->Allow(absl::StrCat(View(request_.target()), " ", kind),
                                      absl::Now(), &dropped)) {
      return;
    }
    if (dropped > 0) {
      spdlog::warn("{} ({} more like this were not logged)", line, dropped);
    } else {
      spdlog::warn("{}", line);
    }
  }

  // --- Relaying an answer as it arrives -----------------------------------

  void StartRelay() {
    turn_.reset();
    const bool not_stored = endpoint_.has_value() && !passthrough_stream_;
    if (not_stored) {
      Count(CaptureResult::kNotStored);
      Log(/*problem=*/true, absl::StatusCodeToString(capture_problem_.code()),
          absl::StrCat("capture ", View(request_.method_string()), " ",
                       View(request_.target()), " peer=", peer_,
                       " result=not-stored: ", capture_problem_.ToString()));
    } else {
      Count(CaptureResult::kPassthrough);
    }
    const std::string capture_header =
        not_stored ? HeaderValue(absl::StrCat("not-stored; ", capture_problem_.ToString())) : "";
    RelayAsFramed(Streams(), std::move(*header_parser_), client_keep_alive_,
                  [&capture_header](http::fields& fields) {
                    if (!capture_header.empty()) fields.set("X-Rollpack-Capture", capture_header);
                  },
                  [self = shared_from_this()](RelayEnd end) { self->EndRelay(std::move(end)); });
    header_parser_.reset();
  }

  void StartCapturedStream() {
    RelayCapturedStream(
        Streams(), std::move(*header_parser_), client_keep_alive_, context_->recorder,
        context_->record_workers, CapturedRequest{*endpoint_, headers_, forwarded_, turn_},
        context_->options.keep_routing,
        [self = shared_from_this()](RelayEnd end) {
          self->upstream_end_ = Clock::now();
          self->Report(end.outcome, end.own_seconds);
          self->EndRelay(std::move(end));
        });
    header_parser_.reset();
  }

  void EndRelay(RelayEnd end) {
    turn_.reset();
    ReleaseUpstream(end.upstream_reusable);
    if (!end.client_reusable) return Close();
    ReadRequest();
  }

  RelayStreams Streams() {
    return RelayStreams{client_, upstream_->stream, upstream_->buffer, context_->options.timeout};
  }

  // --- Answers of its own ----------------------------------------------------

  void ReplyError(http::status status, absl::string_view type, absl::string_view message,
                  bool close, bool count = true) {
    if (count) Count(CaptureResult::kNotStored);
    auto response = std::make_shared<http::response<http::string_body>>(status, 11);
    response->set(http::field::content_type, "application/json");
    response->body() = ErrorJson(type, message);
    response->keep_alive(!close);
    response->prepare_payload();
    WriteResponse(std::move(response), close);
  }

  void WriteResponse(std::shared_ptr<http::response<http::string_body>> response, bool close) {
    client_.expires_after(ToChrono(context_->options.timeout));
    http::async_write(client_, *response,
                      [self = shared_from_this(), response, close](beast::error_code ec, size_t) {
                        if (ec || close) return self->Close();
                        self->ReadRequest();
                      });
  }

  void ReleaseRecordBytes() {
    if (record_bytes_ == 0) return;
    context_->record_budget->Release(record_bytes_);
    record_bytes_ = 0;
  }

  void Count(CaptureResult result) {
    if (context_->metrics == nullptr) return;
    context_->metrics->OnRequest(endpoint_.has_value() ? EndpointName(*endpoint_) : "other",
                                 result);
  }

  void ReleaseUpstream(bool reusable) {
    if (upstream_ == nullptr) return;
    if (reusable && upstream_->buffer.size() == 0 &&
        loop_->idle_upstreams.size() < kMaxIdleUpstreams) {
      loop_->idle_upstreams.push_back({std::move(upstream_), Clock::now()});
    }
    upstream_.reset();
  }

  void Close() {
    turn_.reset();
    beast::error_code ec;
    client_.socket().shutdown(tcp::socket::shutdown_send, ec);
    client_.close();
  }

  static std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
    return absl::ToChronoNanoseconds(d);
  }

  const ProxyContext* const context_;
  Loop* const loop_;
  beast::tcp_stream client_;
  beast::flat_buffer client_buffer_;
  std::string peer_;

  // The exchange in progress.
  std::optional<http::request_parser<http::string_body>> request_parser_;
  http::request<http::string_body> request_;
  http::request<http::string_body> upstream_request_;
  bool client_keep_alive_ = false;
  Clock::time_point start_, upstream_start_, upstream_end_;
  std::optional<CaptureEndpoint> endpoint_;
  CaptureHeaders headers_;
  ForwardedRequest forwarded_;
  bool capture_ = false;
  bool passthrough_stream_ = false;
  absl::Status capture_problem_;
  // A session turn in flight until this exchange ends.
  std::shared_ptr<const SessionTurn> turn_;

  std::unique_ptr<UpstreamConnection> upstream_;
  bool upstream_reused_ = false;
  bool retried_ = false;
  bool upstream_keep_alive_ = false;
  std::optional<http::response_parser<http::empty_body>> header_parser_;
  std::optional<http::response_parser<http::string_body>> string_parser_;
  http::response_header<> response_header_;
  std::string body_;  // the engine's body, then SIMDJSON_PADDING bytes
  int64_t record_bytes_ = 0;  // held in the record budget for it
  uint64_t body_size_ = 0;

};

}  // namespace

void ServeConnection(const ProxyContext* context, Loop* loop, tcp::socket socket) {
  std::make_shared<ProxyConnection>(context, loop, std::move(socket))->Start();
}

}  // namespace rollpack::capture_internal
