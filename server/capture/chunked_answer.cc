#include "server/capture/chunked_answer.h"

#include <memory>
#include <utility>

#include "boost/asio/post.hpp"
#include "boost/beast/http/read.hpp"

namespace rollpack::capture_internal {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

class ChunkedAnswerReader : public std::enable_shared_from_this<ChunkedAnswerReader> {
 public:
  ChunkedAnswerReader(ChunkedAnswerRead read, std::function<void(beast::error_code)> done)
      : read_(read), done_(std::move(done)) {}

  void ReadSome() {
    if (read_.parser.is_done()) return Finish({});
    read_.upstream.expires_after(absl::ToChronoNanoseconds(read_.timeout));
    http::async_read_some(read_.upstream, read_.buffer, read_.parser,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (ec) return self->Finish(ec);
                            self->Charge();
                          });
  }

 private:
  // What the body grew by since the last charge, before the next read:
  // while the budget is spent, the engine's writes wait in the socket.
  void Charge() {
    const int64_t grown =
        static_cast<int64_t>(read_.parser.get().body().size()) - read_.charged;
    if (grown <= 0) return ReadSome();
    read_.budget.Grow(read_.charged, grown, [self = shared_from_this(), grown] {
      // Possibly on a record worker (its Release made room).
      asio::post(self->read_.upstream.get_executor(), [self, grown] {
        self->read_.charged += grown;
        self->ReadSome();
      });
    });
  }

  void Finish(beast::error_code ec) {
    std::function<void(beast::error_code)> done = std::move(done_);
    done(ec);
  }

  ChunkedAnswerRead read_;
  std::function<void(beast::error_code)> done_;
};

}  // namespace

void ReadChunkedAnswer(ChunkedAnswerRead read,
                       std::function<void(beast::error_code)> done) {
  std::make_shared<ChunkedAnswerReader>(read, std::move(done))->ReadSome();
}

}  // namespace rollpack::capture_internal
