#include "client/cpp/microbatch_assembly.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

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
    std::set<std::string, std::less<>> names;
    for (const ReceivedMicrobatch& part : parts_) {
      for (const auto& [name, data] : part.data_) names.insert(name);
    }
    for (const std::string& name : names) {
      absl::Status s = IsHeaderArray(name) ? HeaderArray(name, base) : RowArray(name, base);
      if (!s.ok()) return s;
    }
    v1::Microbatch meta = std::move(parts_[0].meta_);
    meta.clear_piece();
    for (auto& [name, head] : heads_) *MutableArrayOf(&meta, name) = std::move(head);
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
  ReceivedMicrobatch out_;
};

absl::StatusOr<ReceivedMicrobatch> AssembleMicrobatch(ReceivedMicrobatch header,
                                                      std::vector<ReceivedMicrobatch> pieces) {
  return MicrobatchAssembler(std::move(header), std::move(pieces)).Run();
}

}  // namespace rollpack
