// An engine's response made cheap to parse and to edit. Its routing
// payloads (the string values of every "routed_experts" key: megabytes of
// base64 per choice) are cut out by a byte search before simdjson reads the
// rest, and the client's body is the engine's bytes with the edits spliced
// in: docs/capture-design.md measured this against parsing all of an
// 8k-token vLLM chat response (17 MB of routing, 0.86 MB of the rest).
#ifndef ROLLPACK_SERVER_CAPTURE_RESPONSE_SPLICE_H_
#define ROLLPACK_SERVER_CAPTURE_RESPONSE_SPLICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/capture/json_splice.h"
#include "simdjson.h"

namespace rollpack {

class ResponseSplice {
 public:
  ResponseSplice();
  ResponseSplice(const ResponseSplice&) = delete;
  ResponseSplice& operator=(const ResponseSplice&) = delete;
  ~ResponseSplice();

  // Cuts the routing strings out of `body` (followed by SIMDJSON_PADDING
  // readable bytes, and outliving this object) and starts the parser on the
  // rest. One parse per object; the parser and the buffer are the calling
  // thread's, reused across calls.
  absl::Status Parse(absl::string_view body);

  simdjson::ondemand::document& doc() { return doc_; }
  // The text the parser reads; edits and ObjectFields count positions in it.
  absl::string_view text() const { return text_; }
  std::vector<JsonEdit>& edits() { return edits_; }

  // The contents (between the quotes) in the body of the string whose
  // token the parser gives (raw_json_token of a string value): a view of
  // the body, whether or not its bytes were cut.
  absl::string_view StringInBody(absl::string_view token) const;

  // The body with the edits applied; `stripped_bytes` counts the bytes of
  // the routing strings that the applied removals took.
  std::string ClientBody(int64_t* stripped_bytes) const;

  // Routing strings cut before parsing (for tests).
  size_t cuts() const { return cuts_.size(); }

 private:
  struct Cut {
    size_t body_begin = 0;  // the string's first byte after its opening quote
    size_t size = 0;        // bytes up to its closing quote
    size_t text_at = 0;     // where they were in text_ (its closing quote now)
  };

  void FindRoutingStrings();
  size_t ToBody(size_t text_offset) const;

  struct Scratch;               // a parser and a buffer
  Scratch* scratch_ = nullptr;  // the thread's, or own_ while that one is busy
  std::unique_ptr<Scratch> own_;
  absl::string_view body_;
  absl::string_view text_;
  std::vector<Cut> cuts_;
  std::vector<JsonEdit> edits_;
  simdjson::ondemand::document doc_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_RESPONSE_SPLICE_H_
