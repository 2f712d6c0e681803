#include "server/capture/json_splice.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace rollpack {
namespace {

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The offset just past text[..at)'s last non-whitespace byte.
size_t BackOverSpace(absl::string_view text, size_t at) {
  while (at > 0 && IsJsonSpace(text[at - 1])) --at;
  return at;
}

absl::Status NotAnObject(absl::string_view what, size_t offset) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is not a JSON object (byte ", offset, ")"));
}

}  // namespace

std::vector<JsonEdit> NormalizeJsonEdits(std::vector<JsonEdit> edits) {
  std::sort(edits.begin(), edits.end(), [](const JsonEdit& a, const JsonEdit& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    const bool a_inserts = a.begin == a.end, b_inserts = b.begin == b.end;
    if (a_inserts != b_inserts) return a_inserts;
    return a.end > b.end;
  });
  std::vector<JsonEdit> out;
  out.reserve(edits.size());
  size_t applied_end = 0;
  for (JsonEdit& edit : edits) {
    if (!out.empty() && edit.begin < applied_end) continue;  // inside one applied
    applied_end = edit.end;
    out.push_back(std::move(edit));
  }
  return out;
}

std::string SpliceJson(absl::string_view text, const std::vector<JsonEdit>& edits) {
  size_t size = text.size();
  for (const JsonEdit& edit : edits) size = size - (edit.end - edit.begin) + edit.text.size();
  std::string out;
  out.reserve(size);
  size_t at = 0;
  for (const JsonEdit& edit : edits) {
    out.append(text.data() + at, edit.begin - at);
    out.append(edit.text);
    at = edit.end;
  }
  out.append(text.data() + at, text.size() - at);
  return out;
}

void ObjectFields::Add(simdjson::ondemand::field& field) {
  Field f;
  f.key = static_cast<size_t>(field.key().raw() - 1 - text_.data());
  fields_.push_back(std::move(f));
}

void ObjectFields::Remove() {
  if (!fields_.empty()) fields_.back().action = Action::kRemove;
}

void ObjectFields::Replace(std::string value) {
  if (fields_.empty()) return;
  fields_.back().action = Action::kReplace;
  fields_.back().value = std::move(value);
}

void ObjectFields::Append(std::string members) {
  if (!appended_.empty()) appended_.push_back(',');
  appended_.append(members);
}

bool ObjectFields::RemovesAll() const {
  return std::all_of(fields_.begin(), fields_.end(),
                     [](const Field& f) { return f.action == Action::kRemove; });
}

absl::Status ObjectFields::Finish(simdjson::ondemand::document& doc, absl::string_view what,
                                  std::vector<JsonEdit>& edits) const {
  absl::StatusOr<size_t> close = ClosingOffset(doc, text_, '}');
  if (!close.ok()) return NotAnObject(what, text_.size());
  const size_t n = fields_.size();
  // ends[i]: just past field i's value, before the comma that follows it.
  std::vector<size_t> ends(n);
  for (size_t i = 0; i < n; ++i) {
    size_t at = BackOverSpace(text_, i + 1 < n ? fields_[i + 1].key : *close);
    if (i + 1 < n) {
      if (at == 0 || text_[at - 1] != ',') return NotAnObject(what, at);
      at = BackOverSpace(text_, at - 1);
    }
    ends[i] = at;
  }
  bool kept_before = false;
  for (size_t i = 0; i < n; ++i) {
    const Field& f = fields_[i];
    switch (f.action) {
      case Action::kKeep:
        kept_before = true;
        break;
      case Action::kReplace: {
        // The value starts after the key's closing quote, the colon and
        // any whitespace.
        size_t at = f.key + 1;
        while (at < ends[i] && text_[at] != '"') at += text_[at] == '\\' ? 2 : 1;
        at += 1;
        while (at < ends[i] && (IsJsonSpace(text_[at]) || text_[at] == ':')) ++at;
        if (at >= ends[i]) return NotAnObject(what, at);
        edits.push_back({at, ends[i], f.value});
        kept_before = true;
        break;
      }
      case Action::kRemove:
        if (kept_before) {
          edits.push_back({ends[i - 1], ends[i], ""});
        } else if (i + 1 < n && !RemovesAll()) {
          edits.push_back({f.key, fields_[i + 1].key, ""});
        } else if (i == 0) {
          edits.push_back({f.key, ends[n - 1], ""});  // every field goes
        }
        break;
    }
  }
  if (!appended_.empty()) {
    if (n == 0) {
      const size_t open = BackOverSpace(text_, *close);
      if (open == 0 || text_[open - 1] != '{') return NotAnObject(what, open);
      edits.push_back({open, open, appended_});
    } else {
      edits.push_back(
          {ends[n - 1], ends[n - 1], RemovesAll() ? appended_ : absl::StrCat(",", appended_)});
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> ClosingOffset(simdjson::ondemand::document& doc, absl::string_view text,
                                     char closing) {
  size_t at = text.size();
  auto location = doc.current_location();
  if (location.error() == simdjson::SUCCESS) {
    const char* p = location.value_unsafe();
    if (p < text.data() || p > text.data() + text.size()) {
      return absl::InternalError("the parser stands outside the text");
    }
    at = static_cast<size_t>(p - text.data());
  } else if (location.error() != simdjson::OUT_OF_BOUNDS) {
    return absl::InvalidArgumentError(simdjson::error_message(location.error()));
  }
  at = BackOverSpace(text, at);
  if (at == 0 || text[at - 1] != closing) {
    return absl::InvalidArgumentError(
        absl::StrCat("no '", std::string(1, closing), "' before byte ", at));
  }
  return at - 1;
}

bool ParsedToEnd(simdjson::ondemand::document& doc) {
  return doc.current_location().error() == simdjson::OUT_OF_BOUNDS;
}

}  // namespace rollpack
