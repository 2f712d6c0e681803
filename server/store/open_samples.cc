// OpenSamples (open_samples.h): a sample opened by a partial first piece,
// extended piece by piece, and handed to the store once a piece seals it.
#include "server/store/open_samples.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "server/store/durable_log.h"
#include "server/store/heap_bytes.h"
#include "server/store/log_records.h"
#include "server/store/ndarray.h"

namespace rollpack {
namespace {

// Bytes of one routed-expert row as stored ([|M| + D, K] ids, layout.md
// section 10); 0 for a dense model.
int64_t ExpertRowBytes(const ModelSpec& model) {
  if (model.is_dense()) return 0;
  return static_cast<int64_t>(model.stored_layers()) * model.topk * model.stored_id_bytes();
}

// Makes room for `needed` elements, grown as GrownCapacity says.
template <typename T>
void Grow(std::vector<T>& v, int64_t needed, bool last) {
  v.reserve(static_cast<size_t>(GrownCapacity(static_cast<int64_t>(v.capacity()), needed, last)));
}
void Grow(std::string& s, int64_t needed, bool last) {
  const int64_t capacity = static_cast<int64_t>(s.capacity());
  if (needed <= capacity) return;
  if (!last) {
    // At least twice the capacity: reserve allocates exactly that.
    s.reserve(static_cast<size_t>(GrownCapacity(capacity, needed, last)));
    return;
  }
  // A string made at its size is the one way to get exactly `needed` (a
  // reserve of less than twice the capacity doubles it).
  std::string grown(static_cast<size_t>(needed), '\0');
  std::memcpy(grown.data(), s.data(), s.size());
  grown.resize(s.size());
  s.swap(grown);
}

// What appending the next `piece` to the open sample `whole` adds to
// the MemoryBytes of `whole`: the buffers that must grow to hold it,
// grown as ApplyPiece grows them (exactly to size by the piece that seals).
int64_t ExtendedBytes(const StoredSample& whole, const StoredSample& piece, int64_t row_bytes,
                      bool seals) {
  auto string_growth = [seals](const std::string& s, int64_t needed) {
    const int64_t capacity = static_cast<int64_t>(s.capacity());
    return StringBufferBytes(GrownCapacity(capacity, needed, seals)) -
           StringBufferBytes(capacity);
  };
  auto vector_growth = [seals](const auto& v, int64_t needed) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    const int64_t capacity = static_cast<int64_t>(v.capacity());
    return VectorBufferBytes<T>(GrownCapacity(capacity, needed, seals)) -
           VectorBufferBytes<T>(capacity);
  };
  const int64_t n_new = whole.num_tokens() + piece.num_tokens();
  int64_t bytes = vector_growth(whole.tokens, n_new) +
                  string_growth(whole.experts, n_new * row_bytes) +
                  (row_bytes > 0 ? vector_growth(whole.row_valid, n_new) : 0) +
                  vector_growth(whole.pieces, static_cast<int64_t>(whole.pieces.size()) + 1);
  if (piece.num_tokens() > 0) {
    for (const auto& [name, field] : whole.token_fields) {
      const size_t more = piece.token_fields.at(name).data.size();
      bytes += string_growth(field.data, static_cast<int64_t>(field.data.size() + more));
    }
    for (const auto& [name, field] : whole.ragged_fields) {
      const StoredRagged& more = piece.ragged_fields.at(name);
      bytes += vector_growth(field.offsets,
                             static_cast<int64_t>(field.offsets.size()) + more.num_tokens()) +
               string_growth(field.values,
                             static_cast<int64_t>(field.values.size() + more.values.size()));
    }
  }
  return bytes;
}

// Appends a piece's lists (`more`, offsets from 0) to its open sample's
// field, grown as ExtendedBytes counted.
void AppendLists(const StoredRagged& more, bool last, StoredRagged* field) {
  const int64_t base = field->offsets.back();
  Grow(field->offsets, static_cast<int64_t>(field->offsets.size()) + more.num_tokens(), last);
  for (size_t i = 1; i < more.offsets.size(); ++i) field->offsets.push_back(base + more.offsets[i]);
  Grow(field->values, static_cast<int64_t>(field->values.size() + more.values.size()), last);
  field->values += more.values;
}

// Whether `piece`'s ragged lists are those of tokens [begin, begin + t) of
// `whole` (offsets rebased to 0).
bool SameLists(const StoredSample& whole, const StoredSample& piece, int64_t begin, int64_t t) {
  if (piece.ragged_fields.size() != whole.ragged_fields.size()) return false;
  for (const auto& [name, field] : whole.ragged_fields) {
    auto it = piece.ragged_fields.find(name);
    if (it == piece.ragged_fields.end() || it->second.dtype != field.dtype ||
        it->second.num_tokens() != t) {
      return false;
    }
    const int64_t base = field.offsets[begin];
    for (int64_t i = 0; i <= t; ++i) {
      if (it->second.offsets[i] != field.offsets[begin + i] - base) return false;
    }
    const int64_t id_bytes = DTypeSize(field.dtype);
    if (absl::string_view(it->second.values) !=
        absl::string_view(field.values)
            .substr(base * id_bytes, (field.offsets[begin + t] - base) * id_bytes)) {
      return false;
    }
  }
  return true;
}

// ORs into `nonzero` (one flag per MoE layer) whether a covered row of the
// [rows, |M|, K] block has a nonzero id in that layer; returns the covered rows.
int64_t AccumulateLayers(absl::string_view experts, absl::Span<const uint8_t> row_valid,
                         int num_moe, int64_t row_bytes, std::vector<uint8_t>* nonzero) {
  nonzero->resize(num_moe, 0);
  if (num_moe == 0 || row_bytes == 0) return 0;
  const int64_t layer_bytes = row_bytes / num_moe;
  int64_t covered = 0;
  for (size_t r = 0; r < row_valid.size(); ++r) {
    if (!row_valid[r]) continue;
    ++covered;
    const char* row = experts.data() + static_cast<int64_t>(r) * row_bytes;
    for (int m = 0; m < num_moe; ++m) {
      if ((*nonzero)[m]) continue;
      const char* layer = row + m * layer_bytes;
      for (int64_t b = 0; b < layer_bytes; ++b) {
        if (layer[b] != 0) {
          (*nonzero)[m] = 1;
          break;
        }
      }
    }
  }
  return covered;
}

// Copies a piece's routed rows into its open sample (sized for them
// already) and moves where the stored rows end.
void PlaceRows(const StoredSample& piece, const PieceMessage& message, int64_t row_bytes,
               StoredSample* sample, int64_t* rows_end) {
  const int64_t rows = static_cast<int64_t>(piece.row_valid.size());
  if (rows > 0) {
    std::memcpy(sample->experts.data() + message.rows_begin * row_bytes, piece.experts.data(),
                piece.experts.size());
    std::copy(piece.row_valid.begin(), piece.row_valid.end(),
              sample->row_valid.begin() + message.rows_begin);
  }
  if (message.rows_sent) *rows_end = message.rows_begin + rows;
}

std::string Who(const StoredSample& piece) {
  return absl::StrCat("sample \"", piece.sample_id, "\" piece ", piece.piece_message->index, ": ");
}

// A later piece may repeat piece 0's group identically. Its scalars are
// compared with the sample's now (piece 0's, annotations'): another value is
// refused, and a name the sample lacks is taken only from the piece that
// seals it (lifecycle.md section 6), and not while a prepared annotation of
// the sample sets it (`pending`).
absl::Status CheckRepeats(const StoredSample& whole, const StoredSample& piece,
                          const ScalarAnnotation* pending) {
  if (!piece.group_id.empty() && piece.group_id != whole.group_id) {
    return absl::InvalidArgumentError(absl::StrCat(Who(piece), "group_id is \"", piece.group_id,
                                                   "\", piece 0 set \"", whole.group_id, "\""));
  }
  if (piece.group_size != 0 && piece.group_size != whole.group_size) {
    return absl::InvalidArgumentError(absl::StrCat(Who(piece), "group_size is ", piece.group_size,
                                                   ", piece 0 set ", whole.group_size));
  }
  for (const auto& [name, value] : piece.scalars) {
    auto it = whole.scalars.find(name);
    if (it != whole.scalars.end()) {
      if (std::memcmp(&it->second, &value, sizeof(value)) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            Who(piece), "scalars[\"", name, "\"] is ", value, ", the sample has ", it->second,
            " (set by piece 0 or AnnotateSamples)"));
      }
      continue;
    }
    if (piece.piece_message->partial) {
      return absl::InvalidArgumentError(absl::StrCat(
          Who(piece), "scalars[\"", name, "\"] is ", value,
          ", a scalar the sample lacks: only the piece that seals it (partial = false) may add "
          "one (or AnnotateSamples)"));
    }
    if (pending != nullptr && pending->scalars.count(name) > 0) {
      return absl::AbortedError(absl::StrCat(
          Who(piece), "scalars[\"", name,
          "\"]: an annotation of this sample that sets it is in progress; retry"));
    }
  }
  return absl::OkStatus();
}

// A re-sent later piece: its group and scalars as the sample has them.
bool RepeatsStored(const StoredSample& whole, const StoredSample& piece) {
  if (!piece.group_id.empty() && piece.group_id != whole.group_id) return false;
  if (piece.group_size != 0 && piece.group_size != whole.group_size) return false;
  for (const auto& [name, value] : piece.scalars) {
    auto it = whole.scalars.find(name);
    if (it == whole.scalars.end() || std::memcmp(&it->second, &value, sizeof(value)) != 0) {
      return false;
    }
  }
  return true;
}

// Whether `piece` is exactly the k-th piece stored in `whole` (an identical
// re-send), compared on the stored bytes.
bool SamePiece(const StoredSample& whole, const StoredSample& piece, int64_t row_bytes) {
  const size_t k = static_cast<size_t>(piece.piece_message->index);
  if (k >= whole.pieces.size()) return false;
  const PieceBounds& b = whole.pieces[k];
  const int64_t token_begin = k == 0 ? 0 : whole.pieces[k - 1].token_end;
  const int64_t t = b.token_end - token_begin;
  if (piece.piece_message->partial != b.partial || piece.policy_version != b.policy_version) {
    return false;
  }
  if (piece.num_tokens() != t ||
      !std::equal(piece.tokens.begin(), piece.tokens.end(), whole.tokens.begin() + token_begin)) {
    return false;
  }
  const int64_t rows = static_cast<int64_t>(piece.row_valid.size());
  if (piece.piece_message->rows_sent != b.rows_sent || rows != b.rows_end - b.rows_begin) {
    return false;
  }
  if (b.rows_sent) {
    if (piece.piece_message->rows_begin != b.rows_begin) return false;
    if (absl::string_view(piece.experts) !=
        absl::string_view(whole.experts).substr(b.rows_begin * row_bytes, rows * row_bytes)) {
      return false;
    }
    if (!std::equal(piece.row_valid.begin(), piece.row_valid.end(),
                    whole.row_valid.begin() + b.rows_begin)) {
      return false;
    }
  }
  if (t > 0) {
    if (piece.token_fields.size() != whole.token_fields.size()) return false;
    for (const auto& [name, field] : whole.token_fields) {
      auto it = piece.token_fields.find(name);
      if (it == piece.token_fields.end() || it->second.dtype != field.dtype ||
          it->second.trailing_shape != field.trailing_shape ||
          absl::string_view(it->second.data) !=
              absl::string_view(field.data).substr(token_begin * field.row_bytes(),
                                                   t * field.row_bytes())) {
        return false;
      }
    }
    if (!SameLists(whole, piece, token_begin, t)) return false;
  }
  // Scalars added since (the sealing piece's, annotations) are not piece 0's.
  if (k == 0) {
    return piece.group_id == whole.group_id && piece.group_size == whole.group_size &&
           SameScalars(piece.scalars, PutScalars(whole));
  }
  return RepeatsStored(whole, piece);
}

}  // namespace

const StoredSample* OpenSamples::Find(const std::string& sample_id) const {
  auto it = open_.find(sample_id);
  return it == open_.end() ? nullptr : &it->second.sample;
}

absl::StatusOr<OpenSamples::Plan> OpenSamples::PlanPiece(const std::string& pool_name,
                                                         const ModelSpec& model,
                                                         const StoredSample& piece,
                                                         const StoredSample* sealed,
                                                         const ScalarAnnotation* pending) const {
  const int64_t row_bytes = ExpertRowBytes(model);
  const std::string& id = piece.sample_id;
  Plan plan;
  auto open_it = open_.find(id);
  if (!piece.piece_message.has_value()) {
    // An open sample's snapshot (a compacted log): it starts open again.
    if (open_it != open_.end() || sealed != nullptr) {
      return absl::DataLossError(absl::StrCat("open sample \"", id, "\" is stored twice"));
    }
    plan.action = Action::kRestoreOpen;
    plan.new_bytes = memory_bytes_(piece);
    return plan;
  }
  const PieceMessage& message = *piece.piece_message;
  const StoredSample* stored = open_it != open_.end() ? &open_it->second.sample : sealed;
  const int64_t stored_pieces = stored == nullptr ? 0
                                : stored->pieces.empty()
                                    ? 1  // sent whole
                                    : static_cast<int64_t>(stored->pieces.size());
  if (stored != nullptr && message.index < stored_pieces) {
    if (!SamePiece(*stored, piece, row_bytes)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "sample \"", id, "\" already exists in pool \"", pool_name, "\" with a different piece ",
          message.index, stored->pieces.empty() ? " (it was sent whole)" : ""));
    }
    return plan;  // kDuplicate
  }
  if (message.index == 0) {
    // A new sample, opened (a piece 0 that seals is a whole sample).
    const int64_t n = piece.num_tokens();
    plan.action = Action::kOpen;
    // The open sample is the piece with its id assigned afresh, its rows
    // laid out over all its tokens and its first bounds (ApplyPiece).
    const int64_t inline_capacity = InlineStringCapacity();
    plan.new_bytes =
        memory_bytes_(piece) - StringHeapBytes(piece.sample_id) - StringHeapBytes(piece.experts) -
        VectorHeapBytes(piece.row_valid) - VectorHeapBytes(piece.pieces) +
        StringBufferBytes(
            GrownCapacity(inline_capacity, static_cast<int64_t>(piece.sample_id.size()),
                          /*last=*/false)) +
        StringBufferBytes(GrownCapacity(inline_capacity, n * row_bytes, /*last=*/false)) +
        VectorBufferBytes<uint8_t>(row_bytes > 0 ? n : 0) + VectorBufferBytes<PieceBounds>(1);
    return plan;
  }
  if (stored == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "sample \"", id, "\" is not in pool \"", pool_name, "\": piece ", message.index,
        " extends a sample whose piece 0 was not stored here (or that was released)"));
  }
  if (open_it == open_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sample \"", id, "\" is sealed (", stored_pieces, " pieces); piece ", message.index,
        " cannot extend it"));
  }
  if (message.index > stored_pieces) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sample \"", id, "\" has ", stored_pieces, " pieces stored; the next is piece ",
        stored_pieces, ", got piece ", message.index));
  }

  // The next piece: the whole sample it makes must obey layout.md section 1.
  const Entry& open = open_it->second;
  const StoredSample& whole = open.sample;
  RETURN_IF_ERROR(CheckRepeats(whole, piece, pending));
  const int64_t n = whole.num_tokens();
  const int64_t t = piece.num_tokens();
  const int64_t n_new = n + t;
  int64_t field_bytes = 0;
  if (t > 0) {
    for (const auto& [name, field] : whole.token_fields) {
      auto it = piece.token_fields.find(name);
      if (it == piece.token_fields.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Who(piece), "token_fields[\"", name, "\"] is missing (piece 0 sent it; every piece "
            "with tokens carries its rows)"));
      }
      if (it->second.dtype != field.dtype || it->second.trailing_shape != field.trailing_shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            Who(piece), "token_fields[\"", name, "\"] has another dtype or shape than piece 0's"));
      }
      field_bytes += static_cast<int64_t>(it->second.data.size());
    }
    for (const auto& [name, field] : piece.token_fields) {
      if (!whole.token_fields.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            Who(piece), "token_fields[\"", name, "\"] was not in piece 0"));
      }
    }
    // Ragged fields (layout.md section 13): the lists of the piece's tokens.
    for (const auto& [name, field] : whole.ragged_fields) {
      auto it = piece.ragged_fields.find(name);
      if (it == piece.ragged_fields.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Who(piece), "ragged_token_fields[\"", name, "\"] is missing (piece 0 sent it; every "
            "piece with tokens carries their lists)"));
      }
      field_bytes += static_cast<int64_t>(it->second.values.size()) + 8 * t;
    }
    for (const auto& [name, field] : piece.ragged_fields) {
      if (!whole.ragged_fields.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            Who(piece), "ragged_token_fields[\"", name, "\"] was not in piece 0"));
      }
    }
  }
  const int64_t rows = static_cast<int64_t>(piece.row_valid.size());
  int64_t rows_end = open.rows_end;
  if (message.rows_sent) {
    if (open.rows_end >= 0 && message.rows_begin != open.rows_end) {
      return absl::InvalidArgumentError(absl::StrCat(
          Who(piece), "routed_experts_row_offset is ", message.rows_begin,
          "; the stored rows end at ", open.rows_end,
          ", so this piece's rows must start there (stored rows are never replaced)"));
    }
    rows_end = message.rows_begin + rows;
    if (rows_end > n_new) {
      return absl::InvalidArgumentError(absl::StrCat(
          Who(piece), "routed_experts has ", rows, " rows from offset ", message.rows_begin,
          ", ending at ", rows_end, ", past the sample's ", n_new, " tokens"));
    }
  }
  if (!message.partial && !model.is_dense()) {
    if (rows_end < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Who(piece), "seals the sample, but no piece carried routed_experts rows "
                                   "(the model is MoE)"));
    }
    if (rows_end != n_new && rows_end != n_new - 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          Who(piece), "seals the sample with routed_experts rows ending at ", rows_end,
          "; they must end at n = ", n_new, " or n - 1 = ", n_new - 1));
    }
    if (!model.allow_all_zero_layers) {
      const int stored = model.stored_layers();
      std::vector<uint8_t> nonzero = open.layer_nonzero;
      const int64_t covered =
          open.covered_rows + AccumulateLayers(piece.experts, piece.row_valid, stored,
                                               row_bytes, &nonzero);
      for (int m = 0; covered > 1 && m < stored; ++m) {
        if (!nonzero[m]) {
          return absl::InvalidArgumentError(absl::StrCat(
              Who(piece), "routed_experts ", model.StoredLayerName(m), " is 0 for all ",
              covered,
              " covered tokens of the sealed sample: a broken capture (register the model with "
              "allow_all_zero_layers to accept it)"));
        }
      }
    }
  }
  plan.action = Action::kExtend;
  plan.seals = !message.partial;
  plan.new_bytes = ExtendedBytes(whole, piece, row_bytes, plan.seals);
  // Compaction writes a sample as one log record: it must stay under the
  // log's record limit (a whole sample is bounded by --max-message-bytes).
  const int64_t encoded = EncodedSampleBytes(whole) + t * static_cast<int64_t>(sizeof(int32_t)) +
                          t * row_bytes + (row_bytes > 0 ? t : 0) + field_bytes +
                          static_cast<int64_t>(sizeof(PieceBounds));
  if (encoded > kMaxEncodedSampleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Who(piece), "the sample would take ", encoded, " bytes, at most ",
        kMaxEncodedSampleBytes, " (one sample must fit one log record)"));
  }
  return plan;
}

OpenSamples::Applied OpenSamples::ApplyPiece(const Plan& plan, StoredSample piece,
                                             const ModelSpec& model) {
  const int64_t row_bytes = ExpertRowBytes(model);
  const int num_moe = model.stored_layers();  // MoE layers, then routed MTP layers
  const std::string id = piece.sample_id;
  // What the piece's log record holds (its share of a batch's, roughly).
  const int64_t piece_log_bytes = LogRecordBytes(EncodedSampleBytes(piece) + 16);
  Applied applied;
  int64_t before = 0;
  Entry* open = nullptr;
  switch (plan.action) {
    case Action::kDuplicate:
      return applied;
    case Action::kRestoreOpen: {
      open = &open_[id];
      open->sample = std::move(piece);
      open->sample.logged_bytes = piece_log_bytes;
      for (const PieceBounds& b : open->sample.pieces) {
        if (b.rows_sent) open->rows_end = b.rows_end;
      }
      open->covered_rows = AccumulateLayers(open->sample.experts, open->sample.row_valid, num_moe,
                                            row_bytes, &open->layer_nonzero);
      break;
    }
    case Action::kOpen: {
      open = &open_[id];
      StoredSample& s = open->sample;
      const PieceMessage message = *piece.piece_message;
      const int64_t n = piece.num_tokens();
      const int64_t rows = static_cast<int64_t>(piece.row_valid.size());
      s.sample_id = id;
      s.group_id = std::move(piece.group_id);
      s.group_size = piece.group_size;
      s.policy_version = piece.policy_version;
      s.scalars = std::move(piece.scalars);
      s.tokens = std::move(piece.tokens);
      s.token_fields = std::move(piece.token_fields);
      s.ragged_fields = std::move(piece.ragged_fields);
      s.logged_bytes = piece_log_bytes;
      // A dense model's samples hold no rows at all.
      s.experts.assign(static_cast<size_t>(n * row_bytes), '\0');
      if (row_bytes > 0) s.row_valid.assign(static_cast<size_t>(n), 0);
      PlaceRows(piece, message, row_bytes, &s, &open->rows_end);
      s.pieces.push_back({n, message.rows_begin, message.rows_begin + rows, piece.policy_version,
                          true, message.rows_sent});
      open->covered_rows = AccumulateLayers(piece.experts, piece.row_valid, num_moe, row_bytes,
                                            &open->layer_nonzero);
      break;
    }
    case Action::kExtend: {
      open = &open_.at(id);
      StoredSample& s = open->sample;
      before = memory_bytes_(s);
      s.logged_bytes += piece_log_bytes;
      const PieceMessage message = *piece.piece_message;
      const int64_t n_new = s.num_tokens() + piece.num_tokens();
      const int64_t rows = static_cast<int64_t>(piece.row_valid.size());
      // Amortised growth: appending piece after piece stays linear; the
      // piece that seals sizes the buffers exactly (nothing follows it).
      // PlanPiece counted what this adds (ExtendedBytes).
      const bool last = plan.seals;
      Grow(s.tokens, n_new, last);
      s.tokens.insert(s.tokens.end(), piece.tokens.begin(), piece.tokens.end());
      if (piece.num_tokens() > 0) {
        for (auto& [name, field] : s.token_fields) {
          const std::string& more = piece.token_fields.at(name).data;
          Grow(field.data, static_cast<int64_t>(field.data.size() + more.size()), last);
          field.data += more;
        }
        for (auto& [name, field] : s.ragged_fields) {
          AppendLists(piece.ragged_fields.at(name), last, &field);
        }
      }
      Grow(s.experts, n_new * row_bytes, last);
      s.experts.resize(static_cast<size_t>(n_new * row_bytes), '\0');
      if (row_bytes > 0) {
        Grow(s.row_valid, n_new, last);
        s.row_valid.resize(static_cast<size_t>(n_new), 0);
      }
      PlaceRows(piece, message, row_bytes, &s, &open->rows_end);
      open->covered_rows += AccumulateLayers(piece.experts, piece.row_valid, num_moe, row_bytes,
                                             &open->layer_nonzero);
      // Staleness is judged by the oldest tokens.
      s.policy_version = std::min(s.policy_version, piece.policy_version);
      // Scalars the sealing piece adds (PlanPiece refused them elsewhere).
      AddLaterScalars(piece.scalars, &s);
      const int64_t no_rows_at = std::max<int64_t>(open->rows_end, 0);
      Grow(s.pieces, static_cast<int64_t>(s.pieces.size()) + 1, last);
      s.pieces.push_back({n_new, message.rows_sent ? message.rows_begin : no_rows_at,
                          message.rows_sent ? message.rows_begin + rows : no_rows_at,
                          piece.policy_version, message.partial, message.rows_sent});
      break;
    }
  }
  applied.added_bytes = memory_bytes_(open->sample) - before;
  if (plan.seals) {
    // Sealed: the store takes it among its sealed samples.
    auto node = open_.extract(id);
    applied.sealed.emplace(std::move(node.mapped().sample));
  }
  return applied;
}

int64_t OpenSamples::AddScalars(const std::string& sample_id,
                                const std::map<std::string, double>& scalars,
                                int64_t logged_bytes) {
  StoredSample& sample = open_.at(sample_id).sample;
  const int64_t before = memory_bytes_(sample);
  AddLaterScalars(scalars, &sample);
  if (sample.logged_bytes > 0) sample.logged_bytes += logged_bytes;
  return memory_bytes_(sample) - before;
}

int64_t OpenSamples::Erase(const std::string& sample_id) {
  auto it = open_.find(sample_id);
  if (it == open_.end()) return 0;
  const int64_t bytes = memory_bytes_(it->second.sample);
  open_.erase(it);
  return bytes;
}

std::optional<OpenSampleState> OpenSamples::State(const std::string& sample_id) const {
  auto open = open_.find(sample_id);
  if (open == open_.end()) return std::nullopt;
  const StoredSample& sample = open->second.sample;
  OpenSampleState state;
  state.tokens = sample.tokens;
  state.rows_end = open->second.rows_end;
  state.pieces = static_cast<int32_t>(sample.pieces.size());
  state.scalars = sample.scalars;
  for (const auto& [name, field] : sample.token_fields) {
    state.token_fields[name] = FieldSchema{field.dtype, field.trailing_shape};
  }
  for (const auto& [name, field] : sample.ragged_fields) state.ragged_fields.push_back(name);
  return state;
}

}  // namespace rollpack
