#include "server/capture/response_relay.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "boost/asio/post.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/http.hpp"
#include "server/capture/http_fields.h"

namespace rollpack::capture_internal {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

using Clock = std::chrono::steady_clock;

constexpr size_t kChunk = 64 * 1024;

absl::string_view View(beast::string_view s) { return absl::string_view(s.data(), s.size()); }

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(d);
}

// Reads the engine's body a buffer at a time into `buffer`: what a relay of
// either kind starts from. `on_data(n)` gets the bytes read (possibly 0:
// only framing was parsed), `on_error` a broken-off read.
class BodyReader {
 public:
  BodyReader(RelayStreams streams, http::response_parser<http::empty_body>&& header)
      : streams_(streams), parser_(std::move(header)), buffer_(new char[kChunk]) {}

  http::response_parser<http::buffer_body>& parser() { return parser_; }
  bool done() const { return parser_.is_done(); }
  bool until_eof() const { return until_eof_; }
  const char* data() const { return buffer_.get(); }

  template <typename Handler>
  void Read(Handler handler) {
    auto& body = parser_.get().body();
    body.data = buffer_.get();
    body.size = kChunk;
    streams_.upstream.expires_after(ToChrono(streams_.timeout));
    http::async_read_some(
        streams_.upstream, streams_.upstream_buffer, parser_,
        [this, handler = std::move(handler)](beast::error_code ec, size_t) mutable {
          if (ec == http::error::need_buffer) ec = {};
          if (ec == http::error::end_of_stream && until_eof_) ec = {};
          auto& body = parser_.get().body();
          const size_t n = kChunk - body.size;
          body.data = buffer_.get();
          body.size = n;
          handler(ec, n);
        });
  }

  void MarkFraming() { until_eof_ = parser_.get().need_eof(); }

  bool UpstreamReusable() const {
    return parser_.is_done() && !until_eof_ && parser_.get().keep_alive();
  }

 private:
  RelayStreams streams_;
  http::response_parser<http::buffer_body> parser_;
  std::unique_ptr<char[]> buffer_;
  bool until_eof_ = false;
};

class FramedRelay : public std::enable_shared_from_this<FramedRelay> {
 public:
  FramedRelay(RelayStreams streams, http::response_parser<http::empty_body>&& header,
              bool keep_alive, const std::function<void(http::fields&)>& edit, RelayDone done)
      : streams_(streams), reader_(streams, std::move(header)), done_(std::move(done)) {
    auto& message = reader_.parser().get();
    for (auto it = message.begin(); it != message.end();) {
      it = IsHopByHop(View(it->name_string())) ? message.erase(it) : std::next(it);
    }
    edit(message);
    // An answer framed by the end of the connection ends the client's too.
    reader_.MarkFraming();
    keep_client_ = keep_alive && !reader_.until_eof();
    message.keep_alive(keep_client_);
    serializer_.emplace(message);
  }

  void Read() {
    auto& body = reader_.parser().get().body();
    if (reader_.done()) {
      body.data = nullptr;
      body.size = 0;
      body.more = false;
      return Write();
    }
    reader_.Read([self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->End(false);
      auto& body = self->reader_.parser().get().body();
      body.more = !self->reader_.done();
      // Only a chunk's header was parsed: an empty buffer written now would
      // go out as the chunked body's last chunk and end it for the client.
      if (n == 0 && body.more) return self->Read();
      self->Write();
    });
  }

 private:
  void Write() {
    streams_.client.expires_after(ToChrono(streams_.timeout));
    http::async_write(streams_.client, *serializer_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec == http::error::need_buffer) ec = {};
                        if (ec) return self->End(false);
                        if (!self->serializer_->is_done()) return self->Read();
                        self->End(true);
                      });
  }

  void End(bool completed) {
    RelayEnd end;
    end.client_reusable = completed && keep_client_;
    end.upstream_reusable = completed && reader_.UpstreamReusable();
    RelayDone done = std::move(done_);
    done(std::move(end));
  }

  RelayStreams streams_;
  BodyReader reader_;
  RelayDone done_;
  bool keep_client_ = false;
  std::optional<http::response_serializer<http::buffer_body>> serializer_;
};

class CapturedStreamRelay : public std::enable_shared_from_this<CapturedStreamRelay> {
 public:
  CapturedStreamRelay(RelayStreams streams, http::response_parser<http::empty_body>&& header,
                      bool keep_alive, const CaptureRecorder* recorder, WorkerPool* workers,
                      CapturedRequest request, bool keep_routing, RelayDone done)
      : streams_(streams),
        reader_(streams, std::move(header)),
        recorder_(recorder),
        workers_(workers),
        request_(std::move(request)),
        capture_(request_.endpoint, request_.forwarded, keep_routing),
        done_(std::move(done)) {
    reader_.MarkFraming();
    // The engine's header without its framing: the events go out as chunks,
    // the outcome as trailers after the last (it is known only then).
    header_.result(reader_.parser().get().result_int());
    header_.version(11);
    for (const auto& field : reader_.parser().get()) {
      if (IsHopByHop(View(field.name_string())) || IsFraming(View(field.name_string()))) continue;
      header_.insert(field.name_string(), field.value());
    }
    header_.set(http::field::trailer, "X-Rollpack-Sample-Ids, X-Rollpack-Capture");
    header_.chunked(true);
    header_.keep_alive(keep_alive);
    keep_client_ = keep_alive;
    outcome_.pool = request_.headers.pool.value_or(recorder_->default_pool());
  }

  void Start() {
    header_serializer_.emplace(header_);
    streams_.client.expires_after(ToChrono(streams_.timeout));
    http::async_write_header(streams_.client, *header_serializer_,
                             [self = shared_from_this()](beast::error_code ec, size_t) {
                               if (ec) return self->End(false);
                               self->Read();
                             });
  }

 private:
  void Read() {
    if (reader_.done()) return WriteRest();
    reader_.Read([self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->End(false);
      self->read_at_ = Clock::now();
      for (StreamEvent& event : self->capture_.Feed(absl::string_view(self->reader_.data(), n))) {
        self->events_.push_back(std::move(event));
      }
      self->Next();
    });
  }

  // The next event: a choice's final one is stored first (spec section 1:
  // a client that got it can select the sample).
  void Next() {
    if (events_.empty()) return Read();
    auto event = std::make_shared<StreamEvent>(std::move(events_.front()));
    events_.pop_front();
    outcome_.stripped_bytes += event->stripped_bytes;
    if (!event->problem.ok() && problem_.ok()) problem_ = event->problem;
    if (!event->final_choice.has_value()) return WriteChunk(std::move(event->text));
    ++finals_;
    workers_->Schedule([self = shared_from_this(), event] {
      CaptureOutcome stored = self->recorder_->RecordStreamed(
          self->request_, *event->final_choice, event->index, event->response_id);
      asio::post(self->streams_.client.get_executor(),
                 [self, event, stored = std::move(stored)]() mutable {
                   self->Merge(std::move(stored));
                   self->CountOwnTime();
                   self->WriteChunk(std::move(event->text));
                 });
    });
  }

  // Up to now since this read's bytes came, less what an earlier final
  // event of the same read counted.
  void CountOwnTime() {
    const Clock::time_point now = Clock::now();
    own_ += now - std::max(read_at_, counted_until_);
    counted_until_ = now;
  }

  void Merge(CaptureOutcome stored) {
    for (std::string& id : stored.sample_ids) outcome_.sample_ids.push_back(std::move(id));
    outcome_.samples_stored += stored.samples_stored;
    if (!stored.status.ok() && problem_.ok()) problem_ = stored.status;
  }

  void WriteChunk(std::string text) {
    current_ = std::move(text);
    streams_.client.expires_after(ToChrono(streams_.timeout));
    asio::async_write(streams_.client, http::make_chunk(asio::buffer(current_)),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->End(false);
                        self->Next();
                      });
  }

  // Bytes after the last blank line go on as they are, then the trailers.
  void WriteRest() {
    std::string rest = capture_.TakeRest();
    if (!rest.empty()) {
      current_ = std::move(rest);
      streams_.client.expires_after(ToChrono(streams_.timeout));
      asio::async_write(streams_.client, http::make_chunk(asio::buffer(current_)),
                        [self = shared_from_this()](beast::error_code ec, size_t) {
                          if (ec) return self->End(false);
                          self->WriteLast();
                        });
      return;
    }
    WriteLast();
  }

  void WriteLast() {
    if (finals_ == 0 && problem_.ok()) {
      problem_ = absl::FailedPreconditionError("the stream ended without a choice's final event");
    }
    outcome_.status = problem_;
    if (!outcome_.sample_ids.empty()) {
      trailer_.set("X-Rollpack-Sample-Ids", absl::StrJoin(outcome_.sample_ids, ","));
    }
    trailer_.set("X-Rollpack-Capture",
                 problem_.ok() ? std::string("stored")
                               : HeaderValue(absl::StrCat("not-stored; ", problem_.ToString())));
    last_.emplace(http::make_chunk_last(trailer_));
    streams_.client.expires_after(ToChrono(streams_.timeout));
    asio::async_write(streams_.client, *last_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        self->End(!ec);
                      });
  }

  void End(bool completed) {
    RelayEnd end;
    end.client_reusable = completed && keep_client_;
    end.upstream_reusable = completed && reader_.UpstreamReusable();
    if (!completed && problem_.ok()) {
      problem_ = absl::UnavailableError("the stream broke off");
    }
    outcome_.status = problem_;
    end.outcome = std::move(outcome_);
    end.own_seconds = std::chrono::duration<double>(own_).count();
    RelayDone done = std::move(done_);
    done(std::move(end));
  }

  RelayStreams streams_;
  BodyReader reader_;
  const CaptureRecorder* const recorder_;
  WorkerPool* const workers_;
  const CapturedRequest request_;
  StreamCapture capture_;
  RelayDone done_;
  bool keep_client_ = false;
  http::response<http::empty_body> header_;
  std::optional<http::response_serializer<http::empty_body>> header_serializer_;
  std::deque<StreamEvent> events_;
  std::string current_;
  CaptureOutcome outcome_;
  absl::Status problem_;
  int64_t finals_ = 0;
  Clock::time_point read_at_, counted_until_;
  Clock::duration own_{};
  http::fields trailer_;
  std::optional<http::chunk_last<http::fields>> last_;
};

}  // namespace

void RelayAsFramed(RelayStreams streams, http::response_parser<http::empty_body>&& header,
                   bool keep_alive, const std::function<void(http::fields&)>& edit,
                   RelayDone done) {
  std::make_shared<FramedRelay>(streams, std::move(header), keep_alive, edit, std::move(done))
      ->Read();
}

void RelayCapturedStream(RelayStreams streams, http::response_parser<http::empty_body>&& header,
                         bool keep_alive, const CaptureRecorder* recorder, WorkerPool* workers,
                         CapturedRequest request, bool keep_routing, RelayDone done) {
  std::make_shared<CapturedStreamRelay>(streams, std::move(header), keep_alive, recorder,
                                        workers, std::move(request), keep_routing,
                                        std::move(done))
      ->Start();
}

}  // namespace rollpack::capture_internal
