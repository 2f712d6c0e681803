#include "cli/bench/capture_engine.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "boost/asio/buffer.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/read.hpp"
#include "boost/asio/read_until.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/write.hpp"

namespace rollpack {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr int kVocab = 151000;  // a Qwen-sized vocabulary

int32_t PromptToken(int64_t i) { return static_cast<int32_t>((i * 2654435761LL + 17) % kVocab); }
int32_t GeneratedToken(int64_t j) { return static_cast<int32_t>((j * 40503LL + 7919) % kVocab); }

// A token's text: a space and two to five lowercase letters (no escaping).
std::string TokenText(int32_t id) {
  std::string text = " ";
  int64_t v = id;
  const int letters = 2 + static_cast<int>(id % 4);
  for (int i = 0; i < letters; ++i) {
    text.push_back(static_cast<char>('a' + v % 26));
    v /= 26;
  }
  return text;
}

// A float32 logprob written as vLLM writes it (Python's repr of the double).
std::string Logprob(int32_t id, int64_t j) {
  const float lp = -static_cast<float>((id * 31LL + j) % 10000) / 997.0f;
  return absl::StrFormat("%.17g", static_cast<double>(lp));
}

// numpy's np.save of a C-order [rows, layers, topk] integer array.
std::string Npy(const ChoiceShape& s, int64_t rows, const std::vector<int32_t>& tokens) {
  const bool wide = s.experts > 256;
  std::string header =
      absl::StrCat("{'descr': '", wide ? "<i2" : "|u1", "', 'fortran_order': False, 'shape': (",
                   rows, ", ", s.layers, ", ", s.topk, "), }");
  // Magic, version 1.0, uint16 header length; the whole header padded with
  // spaces to a multiple of 64 bytes and ended by a newline.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  const int64_t width = wide ? 2 : 1;
  const size_t start = out.size();
  out.resize(start + static_cast<size_t>(rows) * s.layers * s.topk * width);
  char* at = out.data() + start;
  // topk distinct ids in a row: one from each of topk bands of E / K.
  const int band = s.experts / s.topk;
  for (int64_t r = 0; r < rows; ++r) {
    for (int l = 0; l < s.layers; ++l) {
      const int base = static_cast<int>((7 * r + 3 * l + 11LL * tokens[r]) % band);
      for (int k = 0; k < s.topk; ++k) {
        const int id = base + k * band;
        if (wide) {
          const uint16_t v = static_cast<uint16_t>(id);
          std::memcpy(at, &v, 2);  // little endian (x86)
          at += 2;
        } else {
          *at++ = static_cast<char>(id);
        }
      }
    }
  }
  return out;
}

}  // namespace

std::string VllmChatBody(const ChoiceShape& s, const std::string& id) {
  const int64_t p = s.prompt_tokens, g = s.generated_tokens;
  std::vector<int32_t> tokens;
  tokens.reserve(p + g);
  for (int64_t i = 0; i < p; ++i) tokens.push_back(PromptToken(i));
  for (int64_t j = 0; j < g; ++j) tokens.push_back(GeneratedToken(j));
  std::string content, logprobs, token_ids, prompt_ids;
  logprobs.reserve(static_cast<size_t>(g) * 110);
  for (int64_t j = 0; j < g; ++j) {
    const int32_t t = tokens[p + j];
    const std::string text = TokenText(t);
    content += text;
    if (j > 0) {
      logprobs += ",";
      token_ids += ",";
    }
    absl::StrAppend(&logprobs, "{\"token\":\"", text, "\",\"logprob\":", Logprob(t, j),
                    ",\"bytes\":[");
    for (size_t b = 0; b < text.size(); ++b) {
      absl::StrAppend(&logprobs, b > 0 ? "," : "", static_cast<int>(text[b]));
    }
    logprobs += "],\"top_logprobs\":[]}";
    absl::StrAppend(&token_ids, t);
  }
  for (int64_t i = 0; i < p; ++i) absl::StrAppend(&prompt_ids, i > 0 ? "," : "", tokens[i]);
  const std::string routing = absl::Base64Escape(Npy(s, p + g - 1, tokens));
  return absl::StrCat(
      "{\"id\":\"", id,
      "\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"bench-moe\","
      "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"",
      content,
      "\",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,"
      "\"reasoning\":null},\"logprobs\":{\"content\":[",
      logprobs, "]},\"finish_reason\":\"length\",\"stop_reason\":null,\"token_ids\":[", token_ids,
      "],\"routed_experts\":\"", routing,
      "\"}],\"service_tier\":null,\"system_fingerprint\":null,\"usage\":{\"prompt_tokens\":", p,
      ",\"total_tokens\":", p + g, ",\"completion_tokens\":", g,
      ",\"prompt_tokens_details\":null},\"prompt_logprobs\":null,\"prompt_token_ids\":[",
      prompt_ids,
      "],\"prompt_text\":null,\"kv_transfer_params\":null,\"ec_transfer_params\":null,"
      "\"metrics\":null}");
}

std::string ChatRequestBody(int64_t prompt_tokens, int64_t max_tokens, bool stream) {
  std::string text;
  text.reserve(static_cast<size_t>(prompt_tokens) * 4);
  static constexpr absl::string_view kWords[] = {"the ", "cat ", "sat ", "on ",
                                                 "a ",   "mat ", "and ", "then "};
  for (int64_t i = 0; static_cast<int64_t>(text.size()) < prompt_tokens * 4; ++i) {
    text.append(kWords[i % 8].data(), kWords[i % 8].size());
  }
  return absl::StrCat(
      "{\"model\": \"bench-moe\", \"messages\": [{\"role\": \"system\", \"content\": \"You are a "
      "helpful assistant.\"}, {\"role\": \"user\", \"content\": \"",
      text, "\"}], \"max_tokens\": ", max_tokens, ", \"temperature\": 1.0",
      stream ? ", \"stream\": true" : "", "}");
}

// --- The server ---------------------------------------------------------------

class EngineConnection;

class FakeEngine::Impl {
 public:
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::vector<std::shared_ptr<const std::string>> bodies;
  std::thread thread;
  std::atomic<int64_t> answered{0};
  std::atomic<int64_t> refused{0};

  struct Burst {
    int count = 0;
    Clock::duration spread{};
    std::function<void(int)> on_arrived;
    std::vector<std::pair<std::shared_ptr<EngineConnection>, int>> held;
    std::unique_ptr<asio::steady_timer> deadline;
    bool released = false;
  };
  std::map<std::string, Burst> bursts;  // the engine's thread only

  void Accept();
  void Hold(const std::string& name, std::shared_ptr<EngineConnection> connection, int body);
  void Release(Burst& burst);
};

class EngineConnection : public std::enable_shared_from_this<EngineConnection> {
 public:
  EngineConnection(FakeEngine::Impl* engine, tcp::socket socket)
      : engine_(engine), socket_(std::move(socket)), timer_(engine->io) {
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
  }

  void ReadHeader() {
    asio::async_read_until(socket_, asio::dynamic_buffer(in_), "\r\n\r\n",
                           [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                             if (!ec) self->OnHeader(n);
                           });
  }

  // Answers with body `index` (the burst's release, or at once).
  void Answer(int index) {
    const std::shared_ptr<const std::string>& body = engine_->bodies[index];
    out_ = absl::StrCat("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ",
                        body->size(), "\r\n\r\n");
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(out_), asio::buffer(*body)};
    asio::async_write(socket_, buffers,
                      [self = shared_from_this(), body](boost::system::error_code ec, size_t) {
                        if (ec) return;
                        self->engine_->answered.fetch_add(1, std::memory_order_relaxed);
                        self->ReadHeader();
                      });
  }

  // Answers body `index` at `when`.
  void AnswerAt(Clock::time_point when, int index) {
    timer_.expires_at(when);
    timer_.async_wait([self = shared_from_this(), index](boost::system::error_code ec) {
      if (!ec) self->Answer(index);
    });
  }

 private:
  void OnHeader(size_t header_bytes) {
    const absl::string_view head(in_.data(), header_bytes);
    std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
    size_t length = 0;
    body_index_ = -1;
    burst_.clear();
    stream_events_ = -1;
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == absl::string_view::npos) continue;
      const absl::string_view name = lines[i].substr(0, colon);
      const absl::string_view value = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
      if (absl::EqualsIgnoreCase(name, "content-length")) {
        (void)absl::SimpleAtoi(value, &length);
      } else if (absl::EqualsIgnoreCase(name, "x-bench-body")) {
        (void)absl::SimpleAtoi(value, &body_index_);
      } else if (absl::EqualsIgnoreCase(name, "x-bench-burst")) {
        burst_ = std::string(value);
      } else if (absl::EqualsIgnoreCase(name, "x-bench-stream")) {
        std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(value, ',');
        if (!absl::SimpleAtoi(parts.first, &stream_events_) ||
            !absl::SimpleAtoi(parts.second, &stream_interval_us_)) {
          stream_events_ = -1;
        }
      }
    }
    in_.erase(0, header_bytes);
    body_length_ = length;
    if (in_.size() >= length) return OnBody();
    asio::async_read(socket_, asio::dynamic_buffer(in_),
                     asio::transfer_exactly(length - in_.size()),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (!ec) self->OnBody();
                     });
  }

  void OnBody() {
    const absl::string_view body(in_.data(), body_length_);
    const bool asked = absl::StrContains(body, "\"return_token_ids\"");
    in_.erase(0, body_length_);
    if (stream_events_ >= 0) return StartStream();
    if (!asked || body_index_ < 0 || body_index_ >= static_cast<int>(engine_->bodies.size())) {
      return Refuse(!asked ? "the request has no return_token_ids" : "unknown X-Bench-Body");
    }
    if (!burst_.empty()) return engine_->Hold(burst_, shared_from_this(), body_index_);
    Answer(body_index_);
  }

  void Refuse(absl::string_view why) {
    engine_->refused.fetch_add(1, std::memory_order_relaxed);
    const std::string body = absl::StrCat("{\"error\": {\"message\": \"", why, "\"}}");
    out_ = absl::StrCat(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
        "content-length: ",
        body.size(), "\r\n\r\n", body);
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (!ec) self->ReadHeader();
                      });
  }

  // --- Server-sent events, chunked as uvicorn sends them ---------------------

  void StartStream() {
    out_ =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        "cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";
    stream_start_ = Clock::now();
    stream_sent_ = 0;
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (!ec) self->NextEvent();
                      });
  }

  void NextEvent() {
    if (stream_sent_ == stream_events_) {
      out_ = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
      asio::async_write(socket_, asio::buffer(out_),
                        [self = shared_from_this()](boost::system::error_code ec, size_t) {
                          if (ec) return;
                          self->engine_->answered.fetch_add(1, std::memory_order_relaxed);
                          self->ReadHeader();
                        });
      return;
    }
    timer_.expires_at(stream_start_ +
                      std::chrono::microseconds(stream_interval_us_) * (stream_sent_ + 1));
    timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->WriteEvent();
    });
  }

  void WriteEvent() {
    const int64_t j = stream_sent_;
    const std::string data = absl::StrCat(
        "data: {\"id\":\"chatcmpl-bench-stream\",\"object\":\"chat.completion.chunk\","
        "\"created\":1700000000,\"model\":\"bench-moe\",\"choices\":[{\"index\":0,\"delta\":{"
        "\"content\":\"",
        TokenText(GeneratedToken(j)),
        "\"},\"logprobs\":null,\"finish_reason\":", j + 1 == stream_events_ ? "\"length\"" : "null",
        "}],\"bench_sent_ns\":", SteadyNanos(), "}\n\n");
    out_ = absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
    ++stream_sent_;
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (!ec) self->NextEvent();
                      });
  }

  FakeEngine::Impl* const engine_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  std::string in_;
  std::string out_;
  size_t body_length_ = 0;
  int body_index_ = -1;
  std::string burst_;
  int stream_events_ = -1;
  int64_t stream_interval_us_ = 0;
  int stream_sent_ = 0;
  Clock::time_point stream_start_;
};

void FakeEngine::Impl::Accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
    } else {
      std::make_shared<EngineConnection>(this, std::move(socket))->ReadHeader();
    }
    Accept();
  });
}

void FakeEngine::Impl::Hold(const std::string& name, std::shared_ptr<EngineConnection> connection,
                            int body) {
  auto it = bursts.find(name);
  if (it == bursts.end() || it->second.released) return connection->Answer(body);
  Burst& burst = it->second;
  burst.held.emplace_back(std::move(connection), body);
  if (static_cast<int>(burst.held.size()) >= burst.count) Release(burst);
}

void FakeEngine::Impl::Release(Burst& burst) {
  if (burst.released) return;
  burst.released = true;
  if (burst.deadline) burst.deadline->cancel();
  if (burst.on_arrived) burst.on_arrived(static_cast<int>(burst.held.size()));
  const Clock::time_point now = Clock::now();
  const size_t n = burst.held.size();
  for (size_t i = 0; i < n; ++i) {
    burst.held[i].first->AnswerAt(
        now + burst.spread * static_cast<int64_t>(i) / static_cast<int64_t>(std::max<size_t>(n, 1)),
        burst.held[i].second);
  }
  burst.held.clear();
}

FakeEngine::FakeEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FakeEngine::~FakeEngine() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

absl::StatusOr<std::unique_ptr<FakeEngine>> FakeEngine::Start(std::vector<std::string> bodies) {
  auto impl = std::make_unique<Impl>();
  for (std::string& b : bodies) {
    impl->bodies.push_back(std::make_shared<const std::string>(std::move(b)));
  }
  boost::system::error_code ec;
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), 0);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("fake engine: cannot listen: ", ec.message()));
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<FakeEngine>(new FakeEngine(std::move(impl)));
}

int FakeEngine::port() const { return impl_->acceptor.local_endpoint().port(); }
int64_t FakeEngine::answered() const { return impl_->answered.load(); }
int64_t FakeEngine::refused() const { return impl_->refused.load(); }

void FakeEngine::ArmBurst(const std::string& name, int count, absl::Duration spread,
                          absl::Duration timeout, std::function<void(int)> on_arrived) {
  std::promise<void> armed;
  Impl* impl = impl_.get();
  asio::post(impl->io, [&, impl] {
    Impl::Burst& burst = impl->bursts[name];
    burst = Impl::Burst();
    burst.count = count;
    burst.spread = absl::ToChronoNanoseconds(spread);
    burst.on_arrived = std::move(on_arrived);
    burst.deadline = std::make_unique<asio::steady_timer>(impl->io);
    burst.deadline->expires_after(absl::ToChronoNanoseconds(timeout));
    burst.deadline->async_wait([impl, name](boost::system::error_code ec) {
      if (ec) return;
      auto it = impl->bursts.find(name);
      if (it != impl->bursts.end()) impl->Release(it->second);
    });
    armed.set_value();
  });
  armed.get_future().wait();
}

}  // namespace rollpack
