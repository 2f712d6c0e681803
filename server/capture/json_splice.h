// Edits to JSON text that keep every byte they do not touch. The capture
// port adds fields to a client's request and takes the routing payload, and
// what its own fields caused, out of the engine's answer (shared/spec/
// capture.md section 4: every other key keeps its value and place) by
// splicing: re-serializing would rewrite numbers and cost milliseconds on a
// response of megabytes (docs/capture-design.md). Positions come from
// simdjson's on-demand parser, which reads the text in place.
#ifndef ROLLPACK_SERVER_CAPTURE_JSON_SPLICE_H_
#define ROLLPACK_SERVER_CAPTURE_JSON_SPLICE_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/capture/json_values.h"
#include "simdjson.h"

namespace rollpack {

// text[begin, end) replaced by `text`; an insertion when begin == end.
struct JsonEdit {
  size_t begin = 0;
  size_t end = 0;
  std::string text;
};

// `edits` in text order, without those that lie inside another (a key
// removed from an object that is itself removed). Edits must otherwise not
// overlap; an insertion at the start of a removed range comes before it.
std::vector<JsonEdit> NormalizeJsonEdits(std::vector<JsonEdit> edits);

// `text` with `edits` (normalized) applied.
std::string SpliceJson(absl::string_view text, const std::vector<JsonEdit>& edits);

inline std::string ApplyJsonEdits(absl::string_view text, std::vector<JsonEdit> edits) {
  return SpliceJson(text, NormalizeJsonEdits(std::move(edits)));
}

// The fields of one object of `text` as the on-demand parser walks them,
// and what becomes of each. A removed field takes one separating comma with
// it (the one before it when a kept field precedes it, else the one after),
// so the object stays valid JSON whichever fields go, and the whitespace
// around the kept ones stays as it was.
class ObjectFields {
 public:
  // `text`: the buffer the parser reads (positions are offsets into it).
  explicit ObjectFields(absl::string_view text) : text_(text) {}

  // Records `field`; called for every field of the object, in order, when
  // the loop reaches it.
  void Add(simdjson::ondemand::field& field);
  // What becomes of the field added last: removed, or its value replaced
  // by `value` (JSON text such as "null").
  void Remove();
  void Replace(std::string value);
  // `members` (`"key":value` pairs, comma-separated) become the object's
  // last fields.
  void Append(std::string members);

  size_t size() const { return fields_.size(); }
  // Whether every field is removed (an object left empty).
  bool RemovesAll() const;

  // Called once the loop over the object's fields has ended (the parser is
  // past its closing brace): adds the edits to `edits`. INVALID_ARGUMENT
  // naming `what` when the text around the fields is not an object's.
  absl::Status Finish(simdjson::ondemand::document& doc, absl::string_view what,
                      std::vector<JsonEdit>& edits) const;

 private:
  enum class Action { kKeep, kRemove, kReplace };
  struct Field {
    size_t key = 0;  // the key's opening quote
    Action action = Action::kKeep;
    std::string value;
  };

  absl::string_view text_;
  std::vector<Field> fields_;
  std::string appended_;
};

// visit(key, value, fields) for each field of `object` (in `text`, which
// `doc` parses) in order, the field already added to `fields`; then
// on_end(fields) (to append fields) and the object's edits go to `edits`.
// Errors name the object `what`.
template <typename Visit, typename OnEnd>
absl::Status VisitFields(simdjson::ondemand::document& doc, absl::string_view text,
                         simdjson::ondemand::object& object, absl::string_view what,
                         std::vector<JsonEdit>& edits, Visit&& visit, OnEnd&& on_end) {
  ObjectFields fields(text);
  for (auto item : object) {
    simdjson::ondemand::field field;
    std::string_view key;
    if (auto error = std::move(item).get(field)) return JsonError(what, error);
    fields.Add(field);  // before unescaped_key(), which consumes the key
    if (auto error = field.unescaped_key().get(key)) return JsonError(what, error);
    if (absl::Status s = visit(AbslView(key), field.value(), fields); !s.ok()) return s;
  }
  on_end(fields);
  return fields.Finish(doc, what, edits);
}

template <typename Visit>
absl::Status VisitFields(simdjson::ondemand::document& doc, absl::string_view text,
                         simdjson::ondemand::object& object, absl::string_view what,
                         std::vector<JsonEdit>& edits, Visit&& visit) {
  return VisitFields(doc, text, object, what, edits, visit, [](ObjectFields&) {});
}

// The offset in `text` of the closing brace of the object (or bracket of the
// array) the parser just left, from the location it stands at.
absl::StatusOr<size_t> ClosingOffset(simdjson::ondemand::document& doc, absl::string_view text,
                                     char closing);

// Whether the parser has read all of the text (nothing follows the root).
bool ParsedToEnd(simdjson::ondemand::document& doc);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_JSON_SPLICE_H_
