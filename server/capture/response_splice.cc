#include "server/capture/response_splice.h"

#include <string.h>

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace rollpack {
namespace {

constexpr absl::string_view kRoutingKey = "\"routed_experts\"";
// A thread keeps its buffers between responses (page faults on fresh
// megabytes cost more than the parse), up to this much.
constexpr size_t kKeptBytes = size_t{32} << 20;

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Whether the byte at `at` is escaped: an odd run of backslashes before it.
bool Escaped(absl::string_view text, size_t at) {
  size_t run = 0;
  while (at > run && text[at - run - 1] == '\\') ++run;
  return run % 2 == 1;
}

size_t SkipSpace(absl::string_view text, size_t at) {
  while (at < text.size() && IsJsonSpace(text[at])) ++at;
  return at;
}

}  // namespace

struct ResponseSplice::Scratch {
  simdjson::ondemand::parser parser;
  std::string rest;
  bool busy = false;
};

ResponseSplice::ResponseSplice() = default;

ResponseSplice::~ResponseSplice() {
  if (scratch_ == nullptr || scratch_ == own_.get()) return;
  scratch_->busy = false;
  if (scratch_->rest.capacity() > kKeptBytes) std::string().swap(scratch_->rest);
  if (scratch_->parser.capacity() > kKeptBytes) scratch_->parser = simdjson::ondemand::parser();
}

void ResponseSplice::FindRoutingStrings() {
  const char* b = body_.data();
  const size_t n = body_.size();
  size_t from = 0;
  while (from < n) {
    const void* hit = memmem(b + from, n - from, kRoutingKey.data(), kRoutingKey.size());
    if (hit == nullptr) return;
    const size_t at = static_cast<size_t>(static_cast<const char*>(hit) - b);
    from = at + 1;
    // Inside a string its quotes are escaped: an unescaped one starts a
    // string token, and one followed by ':' is a key.
    if (Escaped(body_, at)) continue;
    size_t v = SkipSpace(body_, at + kRoutingKey.size());
    if (v >= n || b[v] != ':') continue;
    v = SkipSpace(body_, v + 1);
    if (v >= n || b[v] != '"') continue;  // null, or a list: the parser reads it
    ++v;
    size_t end = v;
    for (;;) {
      const void* quote = memchr(b + end, '"', n - end);
      if (quote == nullptr) return;  // unterminated: the parser says so
      end = static_cast<size_t>(static_cast<const char*>(quote) - b);
      if (!Escaped(body_, end)) break;
      ++end;
    }
    if (end > v) cuts_.push_back({v, end - v, 0});
    from = end + 1;
  }
}

absl::Status ResponseSplice::Parse(absl::string_view body) {
  body_ = body;
  cuts_.clear();
  edits_.clear();
  if (scratch_ == nullptr) {
    thread_local Scratch thread_scratch;
    if (thread_scratch.busy) {
      own_ = std::make_unique<Scratch>();
      scratch_ = own_.get();
    } else {
      thread_scratch.busy = true;
      scratch_ = &thread_scratch;
    }
  }
  Scratch& scratch = *scratch_;
  FindRoutingStrings();
  size_t capacity = body.size() + simdjson::SIMDJSON_PADDING;
  if (cuts_.empty()) {
    text_ = body;  // followed by the padding the parser needs
  } else {
    size_t cut_bytes = 0;
    for (const Cut& cut : cuts_) cut_bytes += cut.size;
    std::string& rest = scratch.rest;
    rest.clear();
    rest.reserve(body.size() - cut_bytes + simdjson::SIMDJSON_PADDING);
    size_t at = 0;
    for (Cut& cut : cuts_) {
      rest.append(body.data() + at, cut.body_begin - at);
      cut.text_at = rest.size();
      at = cut.body_begin + cut.size;
    }
    rest.append(body.data() + at, body.size() - at);
    const size_t size = rest.size();
    rest.append(simdjson::SIMDJSON_PADDING, ' ');
    text_ = absl::string_view(rest.data(), size);
    capacity = rest.size();
  }
  if (auto error = scratch.parser.iterate(text_.data(), text_.size(), capacity).get(doc_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not JSON (", simdjson::error_message(error), ")"));
  }
  return absl::OkStatus();
}

size_t ResponseSplice::ToBody(size_t text_offset) const {
  // A cut's bytes stood at its text_at, where its closing quote is now.
  size_t out = text_offset;
  for (const Cut& cut : cuts_) {
    if (cut.text_at > text_offset) break;
    out += cut.size;
  }
  return out;
}

absl::string_view ResponseSplice::StringInBody(absl::string_view token) const {
  const size_t quote = static_cast<size_t>(token.data() - text_.data());
  for (const Cut& cut : cuts_) {
    if (cut.text_at == quote + 1) return body_.substr(cut.body_begin, cut.size);
  }
  token = absl::StripTrailingAsciiWhitespace(token);
  if (token.size() < 2) return absl::string_view();
  return body_.substr(ToBody(quote + 1), token.size() - 2);
}

std::string ResponseSplice::ClientBody(int64_t* stripped_bytes) const {
  std::vector<JsonEdit> mapped;
  mapped.reserve(edits_.size());
  for (const JsonEdit& edit : edits_) {
    mapped.push_back({ToBody(edit.begin), ToBody(edit.end), edit.text});
  }
  mapped = NormalizeJsonEdits(std::move(mapped));
  int64_t stripped = 0;
  size_t e = 0;
  for (const Cut& cut : cuts_) {
    while (e < mapped.size() && mapped[e].end <= cut.body_begin) ++e;
    if (e < mapped.size() && mapped[e].begin < cut.body_begin &&
        cut.body_begin + cut.size <= mapped[e].end) {
      stripped += static_cast<int64_t>(cut.size);
    }
  }
  if (stripped_bytes != nullptr) *stripped_bytes = stripped;
  return SpliceJson(body_, mapped);
}

}  // namespace rollpack
