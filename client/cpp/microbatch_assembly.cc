#include "client/cpp/microbatch_assembly.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "client/cpp/ragged_field.h"

namespace rollpack {
namespace {

constexpr int64_t kMaxBytes = std::numeric_limits<int64_t>::max();

// (first_row, num_rows) of PieceRows.token_rows / router_rows.
struct Span {
  int64_t first = 0;
  int64_t rows = 0;
};

// Rows of an array that a piece fills, for the tiling check.
struct Covered {
  int64_t first = 0;
  int64_t end = 0;
  size_t part = 0;
};

// itemsize (ndarray.proto); 0 for a dtype without one.
int64_t DTypeBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::UINT8: return 1;
    case v1::UINT16:
    case v1::INT16:
    case v1::FLOAT16:
    case v1::BFLOAT16: return 2;
    case v1::INT32:
    case v1::FLOAT32: return 4;
    case v1::INT64:
    case v1::FLOAT64: return 8;
    default: return 0;
  }
}

// Arrays whose rows follow token_rows; replay_experts and replay_mask follow
// router_rows; cu_seqlens and cu_seqlens_padded are the header's alone.
bool IsTokenArray(absl::string_view name) {
  return name == "tokens" || absl::StartsWith(name, ReceivedMicrobatch::kFieldPrefix);
}
bool IsHeaderArray(absl::string_view name) {
  return name == "cu_seqlens" || name == "cu_seqlens_padded";
}
// A ragged field's two arrays are assembled together (RaggedField).
bool IsRaggedArray(absl::string_view name) {
  return absl::StartsWith(name, kRaggedValuesPrefix) ||
         absl::StartsWith(name, kRaggedOffsetsPrefix);
}

const v1::NDArray& ArrayOf(const v1::Microbatch& m, absl::string_view name) {
  if (name == "tokens") return m.tokens();
  if (name == "cu_seqlens") return m.cu_seqlens();
  if (name == "cu_seqlens_padded") return m.cu_seqlens_padded();
  if (name == "replay_experts") return m.replay_experts();
  if (name == "replay_mask") return m.replay_mask();
  auto it = m.token_fields().find(
      std::string(name.substr(ReceivedMicrobatch::kFieldPrefix.size())));
  return it != m.token_fields().end() ? it->second : v1::NDArray::default_instance();
}

v1::NDArray* MutableArrayOf(v1::Microbatch* m, absl::string_view name) {
  if (name == "tokens") return m->mutable_tokens();
  if (name == "replay_experts") return m->mutable_replay_experts();
  if (name == "replay_mask") return m->mutable_replay_mask();
  return &(*m->mutable_token_fields())[std::string(
      name.substr(ReceivedMicrobatch::kFieldPrefix.size()))];
}

std::string Describe(const v1::NDArray& a) {
  return absl::StrCat(v1::DType_Name(a.dtype()), " [", absl::StrJoin(a.shape(), ", "), "]");
}

// a * b, false on overflow (both >= 0).
bool Multiply(int64_t a, int64_t b, int64_t* out) {
  if (a != 0 && b > kMaxBytes / a) return false;
  *out = a * b;
  return true;
}

}  // namespace

class MicrobatchAssembler {
 public:
  MicrobatchAssembler(ReceivedMicrobatch header, std::vector<ReceivedMicrobatch> pieces) {
    parts_.reserve(pieces.size() + 1);
    parts_.push_back(std::move(header));
    for (ReceivedMicrobatch& p : pieces) parts_.push_back(std::move(p));
  }

  absl::StatusOr<ReceivedMicrobatch> Run() {
    const v1::Microbatch& h = parts_[0].meta_;
    where_ = absl::StrCat("micro-batch ", h.index(), " of step \"", h.step_id(), "\"");
    who_.push_back(h.piece().member().empty() ? std::string("the member dialled")
                                              : absl::StrCat("member ", h.piece().member()));
    if (!h.has_piece() || !h.piece().header()) {
      return Loss(0, h.has_piece() ? "a piece without piece.header where the header piece belongs"
                                   : "a message without `piece` where the header piece belongs");
    }
    const auto& members = h.piece().members();
    if (parts_.size() - 1 != static_cast<size_t>(members.size())) {
      return Loss(0, absl::StrCat("the header piece lists ", members.size(),
                                  " other members [", absl::StrJoin(members, ", "), "], but ",
                                  parts_.size() - 1, " pieces were given to assemble"));
    }
    for (int i = 0; i < members.size(); ++i) who_.push_back(absl::StrCat("member ", members[i]));
    for (size_t k = 1; k < parts_.size(); ++k) {
      const v1::Microbatch& p = parts_[k].meta_;
      if (!p.has_piece()) return Loss(k, "a message without `piece`");
      if (p.piece().header()) return Loss(k, "a header piece where its own piece belongs");
      if (!p.piece().member().empty() && p.piece().member() != members[static_cast<int>(k) - 1]) {
        return Loss(k, absl::StrCat("piece.member is \"", p.piece().member(), "\""));
      }
      if (p.step_id() != h.step_id()) {
        return Loss(k, absl::StrCat("a piece of step \"", p.step_id(), "\""));
      }
      if (p.index() != h.index()) {
        return Loss(k, absl::StrCat("a piece of micro-batch ", p.index()));
      }
      if (p.num_microbatches() != h.num_microbatches()) {
        return Loss(k, absl::StrCat("num_microbatches ", p.num_microbatches(), ", the header's ",
                                    h.num_microbatches()));
      }
    }
    for (size_t k = 0; k < parts_.size(); ++k) {
      const v1::PieceRows& rows = parts_[k].meta_.piece();
      token_spans_.emplace_back();
      router_spans_.emplace_back();
      if (absl::Status s = ParseSpans(k, "token_rows", rows.token_rows(), &token_spans_.back());
          !s.ok()) {
        return s;
      }
      if (absl::Status s = ParseSpans(k, "router_rows", rows.router_rows(), &router_spans_.back());
          !s.ok()) {
        return s;
      }
    }

    // Read while each piece still holds its own slices.
    if (absl::Status s = ReadRaggedPieces(); !s.ok()) return s;

    // One slice list: the header's slices, then each piece's.
    std::vector<int64_t> base;
    for (ReceivedMicrobatch& part : parts_) {
      base.push_back(out_.wire_bytes_);
      for (size_t i = 0; i < part.slices_.size(); ++i) {
        out_.slice_offsets_.push_back(out_.wire_bytes_ + part.slice_offsets_[i]);
        out_.slices_.push_back(std::move(part.slices_[i]));
      }
      out_.wire_bytes_ += part.wire_bytes_;
    }
    // Slices made here (a ragged field's rebased offsets) go after the
    // received ones: wire_bytes_ stays what came over the wire.
    slices_end_ = out_.wire_bytes_;
    std::set<std::string, std::less<>> names;
    for (const ReceivedMicrobatch& part : parts_) {
      for (const auto& [name, data] : part.data_) names.insert(name);
    }
    for (const std::string& name : names) {
      if (IsRaggedArray(name)) continue;
      absl::Status s = IsHeaderArray(name) ? HeaderArray(name, base) : RowArray(name, base);
      if (!s.ok()) return s;
    }
    for (const auto& [field, holders] : ragged_holders_) {
      if (absl::Status s = RaggedField(field, holders, base); !s.ok()) return s;
    }
    v1::Microbatch meta = std::move(parts_[0].meta_);
    meta.clear_piece();
    for (auto& [name, head] : heads_) *MutableArrayOf(&meta, name) = std::move(head);
    for (auto& [field, head] : ragged_heads_) {
      (*meta.mutable_ragged_token_fields())[field] = std::move(head);
    }
    out_.meta_ = std::move(meta);
    return std::move(out_);
  }

 private:
  absl::Status Loss(size_t part, absl::string_view what) const {
    return absl::DataLossError(
        absl::StrCat(who_[part], ", ", where_, " (direct pull): ", what));
  }

  absl::Status ParseSpans(size_t part, absl::string_view field,
                          const google::protobuf::RepeatedField<int64_t>& values,
                          std::vector<Span>* spans) const {
    if (values.size() % 2 != 0) {
      return Loss(part, absl::StrCat("piece.", field, " has ", values.size(),
                                     " values, not (first_row, num_rows) pairs"));
    }
    int64_t end = 0;
    for (int i = 0; i < values.size(); i += 2) {
      const Span s{values[i], values[i + 1]};
      const std::string pair =
          absl::StrCat("piece.", field, " pair ", i / 2, " (first_row ", s.first, ", num_rows ",
                       s.rows, ")");
      if (s.first < 0 || s.rows < 0 || s.first > kMaxBytes - s.rows) {
        return Loss(part, absl::StrCat(pair, ": rows must be non-negative"));
      }
      if (s.first < end) {
        return Loss(part, absl::StrCat(pair, " starts before row ", end,
                                       ", the end of the pair before: pairs must be in "
                                       "increasing row order, without overlap"));
      }
      end = s.first + s.rows;
      spans->push_back(s);
    }
    return absl::OkStatus();
  }

  // cu_seqlens, cu_seqlens_padded: whole, in the header alone.
  absl::Status HeaderArray(const std::string& name, const std::vector<int64_t>& base) {
    for (size_t k = 1; k < parts_.size(); ++k) {
      if (parts_[k].data_.count(name) != 0) {
        return Loss(k, absl::StrCat("a piece with ", name,
                                    ", which only the header piece carries"));
      }
    }
    auto it = parts_[0].data_.find(name);
    if (it == parts_[0].data_.end()) return absl::OkStatus();
    ReceivedMicrobatch::ArrayData data = it->second;
    for (ReceivedMicrobatch::Segment& segment : data.segments) segment.from.offset += base[0];
    out_.data_[name] = std::move(data);
    return absl::OkStatus();
  }

  // tokens, token fields, replay_experts, replay_mask: rows from the pieces
  // that list them.
  absl::Status RowArray(const std::string& name, const std::vector<int64_t>& base) {
    const bool token = IsTokenArray(name);
    const absl::string_view span_field = token ? "token_rows" : "router_rows";
    std::vector<size_t> holders;
    for (size_t k = 0; k < parts_.size(); ++k) {
      if (parts_[k].data_.count(name) != 0) holders.push_back(k);
    }
    const v1::NDArray& head = ArrayOf(parts_[holders[0]].meta_, name);
    for (size_t k : holders) {
      const v1::NDArray& other = ArrayOf(parts_[k].meta_, name);
      if (other.dtype() != head.dtype() ||
          !std::equal(other.shape().begin(), other.shape().end(), head.shape().begin(),
                      head.shape().end())) {
        return Loss(k, absl::StrCat(name, " is ", Describe(other), ", ", who_[holders[0]],
                                    " sent it as ", Describe(head)));
      }
    }
    if (parts_[0].data_.count(name) == 0) {
      v1::NDArray copy = head;
      copy.clear_data();
      heads_.emplace_back(name, std::move(copy));
    }
    ReceivedMicrobatch::ArrayData& out = out_.data_[name];
    if (head.shape_size() == 0) {
      // A rank-0 array has no rows to split: only an empty one can come in pieces.
      for (size_t k : holders) {
        if (parts_[k].data_.at(name).size != 0) {
          return Loss(k, absl::StrCat(name, " is ", Describe(head), " (no rows) with ",
                                      parts_[k].data_.at(name).size, " bytes of data"));
        }
      }
      return absl::OkStatus();
    }
    const int64_t rows = head.shape(0);
    if (token && !token_array_rows_.has_value()) token_array_rows_.emplace(name, rows);
    int64_t row_bytes = DTypeBytes(head.dtype());
    bool fits = rows >= 0;
    for (int d = 1; d < head.shape_size() && fits; ++d) {
      fits = head.shape(d) >= 0 && Multiply(row_bytes, head.shape(d), &row_bytes);
    }
    int64_t total = 0;
    if (!fits || !Multiply(rows, row_bytes, &total)) {
      return Loss(holders[0], absl::StrCat(name, " is ", Describe(head),
                                           ": a negative dimension, or more than 2^63 bytes"));
    }
    if (row_bytes == 0 && DTypeBytes(head.dtype()) == 0 && rows > 0) {
      return Loss(holders[0], absl::StrCat(name, " is ", Describe(head), ": ",
                                           v1::DType_Name(head.dtype()),
                                           " has no element size to split its rows by"));
    }
    std::vector<Covered> covered;
    for (size_t k : holders) {
      const ReceivedMicrobatch::ArrayData& data = parts_[k].data_.at(name);
      const int64_t data_offset = data.segments.empty() ? 0 : data.segments[0].from.offset;
      const std::vector<Span>& spans = token ? token_spans_[k] : router_spans_[k];
      int64_t listed = 0;
      for (size_t i = 0; i < spans.size(); ++i) {
        const Span& s = spans[i];
        if (s.first + s.rows > rows) {
          return Loss(k, absl::StrCat("piece.", span_field, " pair ", i, " (first_row ", s.first,
                                      ", num_rows ", s.rows, ") of ", name, ": rows [", s.first,
                                      ", ", s.first + s.rows, ") outside the array's [0, ", rows,
                                      ") (", Describe(head), ")"));
        }
        if (s.rows == 0) continue;
        covered.push_back({s.first, s.first + s.rows, k});
        if (row_bytes > 0) {
          out.segments.push_back({{base[k] + data_offset + listed * row_bytes, s.rows * row_bytes},
                                  s.first * row_bytes});
        }
        listed += s.rows;
      }
      // listed <= rows, so listed * row_bytes <= total: no overflow.
      if (data.size != listed * row_bytes) {
        return Loss(k, absl::StrCat(name, " has ", data.size, " bytes of data, but its ",
                                    span_field, " list ", listed, " rows of ", row_bytes,
                                    " bytes = ", listed * row_bytes, " (", Describe(head), ")"));
      }
    }
    std::sort(covered.begin(), covered.end(),
              [](const Covered& a, const Covered& b) { return a.first < b.first; });
    int64_t at = 0;
    size_t last = holders[0];
    for (const Covered& c : covered) {
      if (c.first < at) {
        return Loss(c.part, absl::StrCat("rows [", c.first, ", ", std::min(at, c.end), ") of ",
                                         name, " (", span_field, ") come from ", who_[last],
                                         " too"));
      }
      if (c.first > at) return Uncovered(name, span_field, at, c.first, rows, holders);
      at = c.end;
      last = c.part;
    }
    if (at < rows) return Uncovered(name, span_field, at, rows, rows, holders);
    std::sort(out.segments.begin(), out.segments.end(),
              [](const ReceivedMicrobatch::Segment& a, const ReceivedMicrobatch::Segment& b) {
                return a.to < b.to;
              });
    out.size = total;
    return absl::OkStatus();
  }

  // A piece's ragged field, checked, and its offsets (the rebase needs
  // every entry: 8 bytes a row, read whole).
  struct RaggedHolder {
    size_t part;
    RaggedShape shape;
    std::vector<int64_t> offsets;
  };

  // Every piece's ragged fields: heads, sizes and offsets are checked
  // before any of their bytes is placed (the rows they cover: RaggedField).
  absl::Status ReadRaggedPieces() {
    for (size_t k = 0; k < parts_.size(); ++k) {
      const ReceivedMicrobatch& part = parts_[k];
      for (const auto& [field, heads] : part.meta_.ragged_token_fields()) {
        const std::string name = absl::StrCat("ragged_token_fields[\"", field, "\"]");
        const std::string where = absl::StrCat(who_[k], ", ", where_, " (direct pull)");
        absl::StatusOr<RaggedShape> shape = ReadRaggedShape(where, field, heads);
        if (!shape.ok()) return shape.status();
        std::vector<RaggedHolder>& holders = ragged_holders_[field];
        if (!holders.empty() && shape->values_dtype != holders[0].shape.values_dtype) {
          return Loss(k, absl::StrCat(name, "'s values are ", v1::DType_Name(shape->values_dtype),
                                      ", ", who_[holders[0].part], " sent them as ",
                                      v1::DType_Name(holders[0].shape.values_dtype)));
        }
        const int64_t values_bytes = std::max<int64_t>(0, part.data_size(RaggedValuesName(field)));
        if (values_bytes != shape->values_bytes()) {
          return Loss(k, absl::StrCat(name, "'s values hold ", values_bytes, " bytes, its ",
                                      shape->num_values, " ", v1::DType_Name(shape->values_dtype),
                                      " need ", shape->values_bytes()));
        }
        const std::string offsets_name = RaggedOffsetsName(field);
        const int64_t offsets_bytes = std::max<int64_t>(0, part.data_size(offsets_name));
        if (offsets_bytes != shape->offsets_bytes()) {
          return Loss(k, absl::StrCat(name, "'s offsets hold ", offsets_bytes, " bytes, its ",
                                      shape->rows + 1, " entries need ", shape->offsets_bytes()));
        }
        std::vector<int64_t> offsets(static_cast<size_t>(shape->rows + 1));
        part.CopyData(offsets_name, offsets.data());
        RaggedOffsetsCheck check(shape->rows, shape->num_values);
        check.Feed(reinterpret_cast<const char*>(offsets.data()), offsets_bytes);
        if (absl::Status s = check.Finish(where, field); !s.ok()) return s;
        holders.push_back({k, *shape, std::move(offsets)});
      }
    }
    return absl::OkStatus();
  }

  // A ragged token field (layout.md section 13): each piece carries the
  // lists of the token rows it lists, offsets from 0 over those rows;
  // assembled, the lists of all rows in row order, offsets rebased from 0.
  // The values stay in the pieces' slices (one segment per row span); the
  // offsets, rewritten, go in a slice of their own.
  absl::Status RaggedField(const std::string& field, const std::vector<RaggedHolder>& holders,
                           const std::vector<int64_t>& base) {
    const std::string values_name = RaggedValuesName(field);
    const std::string offsets_name = RaggedOffsetsName(field);
    const std::string name = absl::StrCat("ragged_token_fields[\"", field, "\"]");
    if (holders.empty()) return absl::OkStatus();
    // After the token arrays, whose errors name the spans more precisely.
    for (const RaggedHolder& h : holders) {
      int64_t listed = 0;
      for (const Span& s : token_spans_[h.part]) listed += s.rows;
      if (h.shape.rows != listed) {
        return Loss(h.part, absl::StrCat(name, " has offsets for ", h.shape.rows,
                                         " rows, but its token_rows list ", listed));
      }
    }

    // Rows: those of the micro-batch's token arrays (tokens, token fields,
    // which carry their full shape), else as far as the pieces list.
    int64_t rows = 0;
    if (token_array_rows_.has_value()) {
      rows = token_array_rows_->second;
    } else {
      for (const RaggedHolder& h : holders) {
        for (const Span& s : token_spans_[h.part]) rows = std::max(rows, s.first + s.rows);
      }
    }
    // The holders' spans in row order must tile [0, rows) exactly once;
    // checked on the spans (bounded by the pieces' bytes) before anything
    // the size of `rows` is allocated.
    struct Run {
      int64_t first;
      int64_t rows;
      int64_t at;  // the piece's row of `first`
      const RaggedHolder* holder;
    };
    std::vector<Run> runs;
    for (const RaggedHolder& h : holders) {
      int64_t at = 0;
      const std::vector<Span>& spans = token_spans_[h.part];
      for (size_t i = 0; i < spans.size(); ++i) {
        const Span& s = spans[i];
        if (s.first + s.rows > rows) {
          return Loss(h.part,
                      absl::StrCat("piece.token_rows pair ", i, " (first_row ", s.first,
                                   ", num_rows ", s.rows, ") of ", name, ": rows [", s.first, ", ",
                                   s.first + s.rows, ") outside the micro-batch's [0, ", rows, ")",
                                   token_array_rows_.has_value()
                                       ? absl::StrCat(" (", token_array_rows_->first, ")")
                                       : ""));
        }
        if (s.rows > 0) runs.push_back({s.first, s.rows, at, &h});
        at += s.rows;
      }
    }
    std::sort(runs.begin(), runs.end(),
              [](const Run& a, const Run& b) { return a.first < b.first; });
    std::vector<size_t> parts;
    for (const RaggedHolder& h : holders) parts.push_back(h.part);
    int64_t at = 0;
    size_t last = holders[0].part;
    for (const Run& run : runs) {
      if (run.first < at) {
        return Loss(run.holder->part,
                    absl::StrCat("rows [", run.first, ", ", std::min(at, run.first + run.rows),
                                 ") of ", name, " (token_rows) come from ", who_[last], " too"));
      }
      if (run.first > at) return Uncovered(name, "token_rows", at, run.first, rows, parts);
      at = run.first + run.rows;
      last = run.holder->part;
    }
    if (at < rows) return Uncovered(name, "token_rows", at, rows, rows, parts);

    // Offsets rebased over all rows; each run's values one segment, in row
    // order (so already sorted by where they go).
    std::vector<int64_t> offsets(static_cast<size_t>(rows) + 1, 0);
    const int64_t item = holders[0].shape.values_dtype == v1::UINT16 ? 2 : 4;
    ReceivedMicrobatch::ArrayData& values = out_.data_[values_name];
    for (const Run& run : runs) {
      const std::vector<int64_t>& own = run.holder->offsets;
      for (int64_t r = 0; r < run.rows; ++r) {
        const size_t i = static_cast<size_t>(run.at + r);
        offsets[static_cast<size_t>(run.first + r) + 1] =
            offsets[static_cast<size_t>(run.first + r)] + own[i + 1] - own[i];
      }
      const int64_t begin = own[static_cast<size_t>(run.at)];
      const int64_t end = own[static_cast<size_t>(run.at + run.rows)];
      if (end > begin) {
        const ReceivedMicrobatch::ArrayData& data = parts_[run.holder->part].data_.at(values_name);
        const int64_t data_offset = data.segments.empty() ? 0 : data.segments[0].from.offset;
        values.segments.push_back(
            {{base[run.holder->part] + data_offset + begin * item, (end - begin) * item},
             offsets[static_cast<size_t>(run.first)] * item});
      }
    }
    values.size = offsets.back() * item;
    const int64_t offsets_bytes = static_cast<int64_t>(offsets.size()) * 8;
    out_.slices_.emplace_back(offsets.data(), static_cast<size_t>(offsets_bytes));
    out_.slice_offsets_.push_back(slices_end_);
    out_.data_[offsets_name] = {offsets_bytes, {{{slices_end_, offsets_bytes}, 0}}};
    slices_end_ += offsets_bytes;

    v1::RaggedArray head = parts_[holders[0].part].meta_.ragged_token_fields().at(field);
    head.mutable_values()->clear_shape();
    head.mutable_values()->add_shape(offsets.back());
    head.mutable_offsets()->clear_shape();
    head.mutable_offsets()->add_shape(rows + 1);
    ragged_heads_.emplace_back(field, std::move(head));
    return absl::OkStatus();
  }

  absl::Status Uncovered(const std::string& name, absl::string_view span_field, int64_t from,
                         int64_t to, int64_t rows, const std::vector<size_t>& holders) const {
    std::vector<std::string> sources;
    for (size_t k : holders) sources.push_back(who_[k]);
    return absl::DataLossError(absl::StrCat(
        where_, " (direct pull): rows [", from, ", ", to, ") of ", name, " (", rows,
        " rows) are in no piece's ", span_field, " (pieces with ", name, " from ",
        absl::StrJoin(sources, ", "), ")"));
  }

  std::vector<ReceivedMicrobatch> parts_;  // the header, then the pieces
  std::vector<std::string> who_;          // "member <address>" of each part
  std::string where_;
  std::vector<std::vector<Span>> token_spans_;
  std::vector<std::vector<Span>> router_spans_;
  // Heads (dtype, shape) of arrays the header piece lacks.
  std::vector<std::pair<std::string, v1::NDArray>> heads_;
  // Each ragged field's pieces, in part order (ReadRaggedPieces).
  std::map<std::string, std::vector<RaggedHolder>> ragged_holders_;
  // The assembled heads of the ragged fields.
  std::vector<std::pair<std::string, v1::RaggedArray>> ragged_heads_;
  // The first token array with rows (name, rows): a ragged field has as many.
  std::optional<std::pair<std::string, int64_t>> token_array_rows_;
  // Where the next slice made here starts (ReceivedMicrobatch::Range).
  int64_t slices_end_ = 0;
  ReceivedMicrobatch out_;
};

absl::StatusOr<ReceivedMicrobatch> AssembleMicrobatch(ReceivedMicrobatch header,
                                                      std::vector<ReceivedMicrobatch> pieces) {
  return MicrobatchAssembler(std::move(header), std::move(pieces)).Run();
}

}  // namespace rollpack
