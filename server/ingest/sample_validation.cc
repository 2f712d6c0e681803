#include "server/ingest/sample_validation.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/ingest/expert_id_check.h"
#include "server/ingest/ragged_field_validation.h"
#include "server/ingest/token_field_conversion.h"
#include "server/ingest/token_versions.h"
#include "server/store/names.h"
#include "server/store/ndarray.h"

namespace rollpack {
namespace {

// The first NaN or infinity of a floating-point array: its element index
// and how it prints; nullopt when every element is finite (integer arrays
// always are).
std::optional<std::pair<int64_t, std::string>> FirstNonFinite(v1::DType dtype,
                                                               absl::string_view bytes) {
  // 16-bit formats: all exponent bits set is an infinity (no mantissa) or a NaN.
  auto half = [&](uint16_t exponent, uint16_t mantissa, uint16_t sign)
      -> std::optional<std::pair<int64_t, std::string>> {
    for (int64_t i = 0; i < static_cast<int64_t>(bytes.size() / 2); ++i) {
      const uint16_t h = static_cast<uint16_t>(static_cast<uint8_t>(bytes[2 * i]) |
                                               static_cast<uint8_t>(bytes[2 * i + 1]) << 8);
      if ((h & exponent) == exponent) {
        return std::make_pair(i, std::string((h & mantissa) != 0 ? "nan"
                                             : (h & sign) != 0  ? "-inf"
                                                                : "inf"));
      }
    }
    return std::nullopt;
  };
  switch (dtype) {
    case v1::FLOAT32:
      for (int64_t i = 0; i < static_cast<int64_t>(bytes.size() / 4); ++i) {
        float f;
        std::memcpy(&f, bytes.data() + 4 * i, 4);
        if (!std::isfinite(f)) return std::make_pair(i, absl::StrCat(f));
      }
      return std::nullopt;
    case v1::FLOAT16:
      return half(0x7C00, 0x03FF, 0x8000);
    case v1::BFLOAT16:
      return half(0x7F80, 0x007F, 0x8000);
    default:
      return std::nullopt;
  }
}
// The durable log's codec keeps at most 16 dimensions after n; a field it
// could not replay must not be acknowledged (found by
// fuzz/sample_validation_fuzzer).
constexpr int kMaxTokenFieldRank = 1 + kMaxTokenFieldTrailingDims;

struct ExpertsInput {
  ArrayView view;
  int64_t row_offset = 0;
  int64_t rows = 0;
  int payload_layers = 0;
  // Payload layer index of each stored layer: the MoE layers in M order,
  // then the routed MTP layers (layout.md section 10).
  std::vector<int> moe_payload_index;
};

class SampleValidator {
 public:
  // `owned` is null or `&sample`: a request the caller discards afterwards,
  // whose payload bytes may then be moved into the result.
  SampleValidator(const v1::Sample& sample, const ModelSpec& model,
                  absl::Span<const DeclaredTokenField> declared, int64_t* growth_budget,
                  v1::Sample* owned)
      : sample_(sample), owned_(owned), model_(model), declared_(declared),
        growth_budget_(growth_budget),
        who_(absl::StrCat("sample \"", sample.sample_id(), "\": ")) {}

  absl::StatusOr<StoredSample> Run() {
    RETURN_IF_ERROR(ValidateName("sample_id", sample_.sample_id(), kMaxSampleIdBytes));
    StoredSample out;
    out.sample_id = sample_.sample_id();
    out.group_id = sample_.group_id();
    out.policy_version = sample_.policy_version();
    RETURN_IF_ERROR(ConvertGroup(out));
    out.scalars.insert(sample_.scalars().begin(), sample_.scalars().end());

    RETURN_IF_ERROR(ConvertTokens(out));
    RETURN_IF_ERROR(ConvertExperts(out));
    RETURN_IF_ERROR(ConvertTokenFields(out));
    RETURN_IF_ERROR(ApplyTokenVersions(who_, &out));
    RETURN_IF_ERROR(ConvertRaggedFields(sample_, n_, model_, declared_, who_, owned_,
                                        growth_budget_, &out.ragged_fields));
    return out;
  }

 private:
  absl::Status Invalid(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(who_, message));
  }

  absl::Status ConvertGroup(StoredSample& out) {
    if (sample_.piece() < 0) {
      return Invalid(absl::StrCat("piece is ", sample_.piece(), ", must be >= 0"));
    }
    if (sample_.partial() || sample_.piece() != 0) {
      // A piece (lifecycle.md section 5): validated on its own here; where
      // its rows fall in the whole sample is the store's check.
      out.piece_message = PieceMessage{sample_.piece(), sample_.partial(), 0};
      later_piece_ = sample_.piece() > 0;
    }
    if (sample_.group_size() < 0) {
      return Invalid(absl::StrCat("group_size is ", sample_.group_size(), ", must be >= 0"));
    }
    if (sample_.group_size() > 0 && sample_.group_id().empty() && !later_piece_) {
      return Invalid(absl::StrCat("group_size is ", sample_.group_size(),
                                  " but group_id is empty; a group needs an id"));
    }
    out.group_size = sample_.group_size();
    return absl::OkStatus();
  }

  absl::Status ConvertTokens(StoredSample& out) {
    if (!sample_.has_tokens() || IsEmptyArray(sample_.tokens())) {
      // A later piece may only seal (or add rows for tokens already sent).
      if (later_piece_) return absl::OkStatus();
      return Invalid("tokens is missing");
    }
    ASSIGN_OR_RETURN(ArrayView tokens, ViewArray(sample_.tokens(), who_ + "tokens"));
    if (tokens.dtype != v1::INT32) {
      return Invalid(absl::StrCat("tokens has dtype ", DTypeName(tokens.dtype),
                                  ", must be int32"));
    }
    if (tokens.rank() != 1) {
      return Invalid(absl::StrCat("tokens has rank ", tokens.rank(), ", must be 1"));
    }
    n_ = tokens.dim(0);
    if (n_ < 1 && !later_piece_) return Invalid("tokens is empty, need at least 1 token");
    out.tokens.resize(n_);
    // A later piece may carry an empty array: no bytes, and memcpy must not
    // see its null pointer (found by CI's UBSan fuzz run).
    if (n_ > 0) std::memcpy(out.tokens.data(), tokens.data.data(), tokens.data.size());
    return absl::OkStatus();
  }

  absl::Status ConvertExperts(StoredSample& out) {
    const bool sent = sample_.has_routed_experts() && !IsEmptyArray(sample_.routed_experts());
    if (model_.is_dense()) {
      if (sent) {
        return Invalid(absl::StrCat("routed_experts sent, but model \"", model_.name,
                                    "\" is dense (num_experts 0)"));
      }
      return absl::OkStatus();
    }
    if (!sent) {
      // No rows yet (a first piece that is not the last: looser than a
      // whole sample, whose seal is checked over the whole) or no new ones.
      if (out_piece()) return absl::OkStatus();
      return Invalid("routed_experts is missing (the model is MoE)");
    }
    ASSIGN_OR_RETURN(ExpertsInput input, CheckExpertsShape());
    if (out.piece_message.has_value()) out.piece_message->rows_sent = true;
    return ConvertExpertRows(input, out);
  }

  absl::StatusOr<ExpertsInput> CheckExpertsShape() {
    ExpertsInput in;
    absl::StatusOr<ArrayView> view = ViewArray(sample_.routed_experts(), who_ + "routed_experts");
    if (!view.ok()) return view.status();
    in.view = *std::move(view);
    const v1::DType dtype = in.view.dtype;
    if (dtype != v1::UINT8 && dtype != v1::UINT16 && dtype != v1::INT16 &&
        dtype != v1::INT32) {
      return Invalid(absl::StrCat("routed_experts has dtype ", DTypeName(dtype),
                                  ", must be uint8, uint16, int16 or int32"));
    }
    if (dtype == v1::UINT8 && model_.num_experts > 256) {
      return Invalid(absl::StrCat(
          "routed_experts is uint8 but num_experts is ", model_.num_experts,
          " (> 256): the ids were truncated by the producer"));
    }
    if (in.view.rank() != 3) {
      return Invalid(absl::StrCat("routed_experts has rank ", in.view.rank(),
                                  ", must be 3 [rows, layers, topk]"));
    }
    in.rows = in.view.dim(0);
    const int64_t layers = in.view.dim(1);
    const int64_t k = in.view.dim(2);
    stored_ids_ = model_.StoredLayerIds();
    const int64_t num_moe = model_.num_moe_layers();
    const int64_t mtp = model_.routed_mtp_layers();
    const int64_t full_layers = int64_t{model_.num_layers} + mtp;
    if (layers != full_layers && layers != num_moe + mtp) {
      if (mtp > 0) {
        return Invalid(absl::StrCat(
            "routed_experts has ", layers, " layers, must be num_layers + num_mtp_layers = ",
            model_.num_layers, " + ", mtp, " = ", full_layers,
            " (full) or len(moe_layers) + num_mtp_layers = ", num_moe, " + ", mtp, " = ",
            num_moe + mtp, " (compact); the model has mtp_routing, so the MTP layers' routing "
            "follows the decoder's"));
      }
      const int64_t d = model_.num_mtp_layers;
      const bool carries_mtp =
          d > 0 && (layers == model_.num_layers + d || layers == num_moe + d);
      return Invalid(absl::StrCat(
          "routed_experts has ", layers, " layers, must be num_layers = ", model_.num_layers,
          " (full) or len(moe_layers) = ", num_moe, " (compact)",
          carries_mtp ? absl::StrCat("; it seems to carry the num_mtp_layers = ", d,
                                     " MTP layers too, which needs the model registered with "
                                     "mtp_routing")
                      : ""));
    }
    if (k != model_.topk) {
      return Invalid(absl::StrCat("routed_experts has topk ", k, ", model topk is ",
                                  model_.topk));
    }
    in.payload_layers = static_cast<int>(layers);
    // Full: an entry's index is its global layer id (MTP layer d at N + d).
    const bool full = layers == full_layers;
    for (size_t i = 0; i < stored_ids_.size(); ++i) {
      in.moe_payload_index.push_back(full ? stored_ids_[i] : static_cast<int>(i));
    }
    in.row_offset = sample_.routed_experts_row_offset();
    if (in.row_offset < 0) {
      return Invalid(absl::StrCat("routed_experts_row_offset is ", in.row_offset,
                                  ", must be >= 0"));
    }
    const int64_t end = in.row_offset + in.rows;
    if (out_piece()) {
      // The piece's rows are kept alone, from its offset; the store checks
      // them against the rows already stored. A first piece that is not the
      // last may end them anywhere inside its tokens.
      base_ = in.row_offset;
      out_rows_ = in.rows;
      if (!later_piece_ && end > n_) {
        return Invalid(absl::StrCat("routed_experts has ", in.rows, " rows from offset ",
                                    in.row_offset, ", ending at ", end, "; must end inside its ",
                                    n_, " tokens"));
      }
      return in;
    }
    out_rows_ = n_;
    if (end != n_ && end != n_ - 1) {
      return Invalid(absl::StrCat("routed_experts has ", in.rows, " rows from offset ",
                                  in.row_offset, ", ending at ", end, "; must end at n = ", n_,
                                  " or n - 1 = ", n_ - 1));
    }
    return in;
  }

  // One pass over the payload: classify each row (replay or missing), check
  // ids, and copy MoE (and routed MTP) layers into the compact stored layout. Typed on the
  // input and stored id widths. uint8 (what producers send when E <= 256)
  // first tries the word-at-a-time path; what it refuses comes here for the
  // exact error.
  absl::Status ConvertExpertRows(const ExpertsInput& in, StoredSample& out) {
    const bool narrow = model_.stored_id_bytes() == 1;
    switch (in.view.dtype) {
      case v1::UINT8:
        if (TryConvertDirect<uint8_t>(in, out)) return absl::OkStatus();
        return ConvertTyped<uint8_t, uint8_t>(in, out);
      case v1::UINT16:
        if (!narrow && TryConvertDirect<uint16_t>(in, out)) return absl::OkStatus();
        return narrow ? ConvertTyped<uint16_t, uint8_t>(in, out)
                      : ConvertTyped<uint16_t, uint16_t>(in, out);
      case v1::INT16:
        // Read as uint16, a negative id is >= 32768: refused by the fast
        // check whenever E <= 32768, so the exact path sees missing rows.
        if (!narrow && model_.num_experts <= 32768 && TryConvertDirect<uint16_t>(in, out)) {
          return absl::OkStatus();
        }
        return narrow ? ConvertTyped<int16_t, uint8_t>(in, out)
                      : ConvertTyped<int16_t, uint16_t>(in, out);
      default:
        return narrow ? ConvertTyped<int32_t, uint8_t>(in, out)
                      : ConvertTyped<int32_t, uint16_t>(in, out);
    }
  }

  // Ids already of the stored width (uint8; uint16 and non-negative int16
  // when E > 256) in a payload without missing rows (-1 is not a valid id
  // of that width): a valid payload's stored layers are kept as they came,
  // moved without a copy when they are exactly [n, |M| + D, K] and the
  // request is ours, else copied once. False (nothing stored) when some id
  // breaks a rule or a row is missing; ConvertTyped then names it.
  template <typename Id>
  bool TryConvertDirect(const ExpertsInput& in, StoredSample& out) {
    const int k = model_.topk;
    const int num_stored = static_cast<int>(stored_ids_.size());
    const int64_t row_bytes = int64_t{num_stored} * k * int64_t{sizeof(Id)};
    const int64_t total = out_rows_ * row_bytes;
    const int64_t first = (in.row_offset - base_) * row_bytes;
    const char* src = in.view.data.data();
    // Compact, or full with every layer MoE: the payload rows are the stored rows.
    const bool compact = in.payload_layers == num_stored;
    std::string experts;
    const char* rows = src;
    if (!compact) {
      experts.resize(total);
      GatherMoeLayers(in, src, sizeof(Id), experts.data() + first);
      rows = experts.data() + first;
    }
    const Id* ids = reinterpret_cast<const Id*>(rows);
    bool valid;
    if constexpr (sizeof(Id) == 1) {
      valid = Uint8ExpertIdsValid(ids, in.rows * num_stored, k, model_.num_experts);
    } else {
      valid = Uint16ExpertIdsValid(ids, in.rows * num_stored, k, model_.num_experts);
    }
    if (!valid) return false;
    if (!model_.allow_all_zero_layers && !out_piece() && in.rows > 1 &&
        !EveryLayerNonzero(ids, in.rows, num_stored, k)) {
      return false;
    }
    if (compact) {
      if (owned_ != nullptr && first == 0 && in.rows == out_rows_) {
        experts = std::move(*owned_->mutable_routed_experts()->mutable_data());
      } else {
        experts.reserve(total);
        experts.append(first, '\0');
        experts.append(in.view.data.data(), in.rows * row_bytes);
        experts.append(total - first - in.rows * row_bytes, '\0');
      }
    }
    out.experts = std::move(experts);
    out.row_valid.assign(out_rows_, 0);
    std::fill_n(out.row_valid.begin() + (in.row_offset - base_), in.rows, 1);
    if (out.piece_message.has_value()) out.piece_message->rows_begin = base_;
    return true;
  }

  // Copies the stored layers of every payload row of `id_bytes` ids into
  // `dst` ([rows, |M| + D, K]), one memcpy per run of consecutive MoE
  // layers (DeepSeek-V3: one run).
  void GatherMoeLayers(const ExpertsInput& in, const char* src, size_t id_bytes,
                       char* dst) const {
    const int k = model_.topk;
    std::vector<std::pair<int, int>> runs;  // (first payload layer, layers)
    for (int idx : in.moe_payload_index) {
      if (!runs.empty() && runs.back().first + runs.back().second == idx) {
        ++runs.back().second;
      } else {
        runs.emplace_back(idx, 1);
      }
    }
    const int64_t row_stride = int64_t{in.payload_layers} * k * static_cast<int64_t>(id_bytes);
    for (int64_t r = 0; r < in.rows; ++r) {
      const char* row = src + r * row_stride;
      for (const auto& [layer, count] : runs) {
        const size_t bytes = static_cast<size_t>(count) * k * id_bytes;
        std::memcpy(dst, row + int64_t{layer} * k * static_cast<int64_t>(id_bytes), bytes);
        dst += bytes;
      }
    }
  }

  template <typename In, typename Stored>
  absl::Status ConvertTyped(const ExpertsInput& in, StoredSample& out) {
    const int k = model_.topk;
    const int num_stored = static_cast<int>(stored_ids_.size());
    const int64_t e = model_.num_experts;
    out.row_valid.assign(out_rows_, 0);
    out.experts.assign(static_cast<size_t>(out_rows_) * num_stored * k * sizeof(Stored), '\0');
    if (out.piece_message.has_value()) out.piece_message->rows_begin = base_;
    Stored* dst_all = reinterpret_cast<Stored*>(out.experts.data());
    const In* src_all = in.view.as<In>();
    const int64_t row_stride = int64_t{in.payload_layers} * k;

    // seen[id] == stamp marks ids already taken in the current (row, layer):
    // a duplicate check in O(K) without clearing between rows.
    std::vector<uint32_t> seen(e, 0);
    uint32_t stamp = 0;
    std::vector<uint8_t> layer_nonzero(num_stored, 0);
    int64_t covered_rows = 0;
    for (int64_t r = 0; r < in.rows; ++r) {
      const int64_t token = in.row_offset + r;
      const In* row = src_all + r * row_stride;
      if (std::is_signed_v<In> && RowIsAllMissing(row, in)) continue;
      ++covered_rows;
      Stored* dst = dst_all + (token - base_) * num_stored * k;
      for (int m = 0; m < num_stored; ++m) {
        const In* ids = row + int64_t{in.moe_payload_index[m]} * k;
        ++stamp;
        In any = 0;
        for (int j = 0; j < k; ++j) {
          const int64_t id = ids[j];
          if (id < 0 || id >= e) {
            return Invalid(absl::StrCat(
                "routed_experts row ", r, " (token ", token, ") ", LayerName(m),
                " has expert id ", id, ", must be in [0, ", e, ")",
                id == -1 ? " (-1 marks a missing token only when the whole row is -1)" : ""));
          }
          if (seen[id] == stamp) {
            RETURN_IF_ERROR(CheckZeroLayer<In>(in, m));
            return Invalid(absl::StrCat("routed_experts row ", r, " (token ", token, ") ",
                                        LayerName(m), " repeats expert id ", id,
                                        " (topk ids must be distinct)"));
          }
          seen[id] = stamp;
          any |= ids[j];
          dst[j] = static_cast<Stored>(id);
        }
        layer_nonzero[m] |= any != 0;
        dst += k;
      }
      out.row_valid[token - base_] = 1;
    }
    // A piece's layers are checked over the whole sample when it is sealed.
    if (!model_.allow_all_zero_layers && !out_piece() && covered_rows > 1) {
      for (int m = 0; m < num_stored; ++m) {
        if (!layer_nonzero[m]) return ZeroLayerError(m, covered_rows);
      }
    }
    return absl::OkStatus();
  }

  template <typename In>
  bool RowIsAllMissing(const In* row, const ExpertsInput& in) const {
    const int k = model_.topk;
    for (int idx : in.moe_payload_index) {
      for (int j = 0; j < k; ++j) {
        if (row[int64_t{idx} * k + j] != -1) return false;
      }
    }
    return true;
  }

  // A duplicate 0 is what a zero-filled layer looks like with topk > 1; name
  // the real cause when the whole layer is zero.
  template <typename In>
  absl::Status CheckZeroLayer(const ExpertsInput& in, int m) const {
    if (model_.allow_all_zero_layers || out_piece()) return absl::OkStatus();
    const int k = model_.topk;
    const int64_t row_stride = int64_t{in.payload_layers} * k;
    int64_t covered = 0;
    for (int64_t r = 0; r < in.rows; ++r) {
      const In* row = in.view.as<In>() + r * row_stride;
      if (std::is_signed_v<In> && RowIsAllMissing(row, in)) continue;
      ++covered;
      const In* ids = row + int64_t{in.moe_payload_index[m]} * k;
      for (int j = 0; j < k; ++j) {
        if (ids[j] != 0) return absl::OkStatus();
      }
    }
    return covered > 1 ? ZeroLayerError(m, covered) : absl::OkStatus();
  }

  // "layer 5" for a decoder MoE layer (as before MTP layers existed),
  // "MTP layer 0 (layer 61)" for a routed MTP layer.
  std::string LayerName(int m) const {
    if (stored_ids_[m] < model_.num_layers) return absl::StrCat("layer ", stored_ids_[m]);
    return model_.StoredLayerName(m);
  }

  absl::Status ZeroLayerError(int m, int64_t covered_rows) const {
    return Invalid(absl::StrCat("routed_experts ", model_.StoredLayerName(m),
                                " is 0 for all ", covered_rows,
                                " covered tokens: a broken capture (register the model with "
                                "allow_all_zero_layers to accept it)"));
  }

  absl::Status ConvertTokenFields(StoredSample& out) {
    // By name: a protobuf map's iteration order differs between copies of a
    // message, and with two bad fields the error must not depend on it.
    std::map<std::string, const v1::NDArray*> by_name;
    for (const auto& [name, array] : sample_.token_fields()) by_name.emplace(name, &array);
    for (const auto& [name, array_ptr] : by_name) {
      const v1::NDArray& array = *array_ptr;
      const std::string what = absl::StrCat(who_, "token_fields[\"", name, "\"]");
      if (name.empty()) return Invalid("token_fields has an empty name");
      if (absl::Status bad = ValidateName("token field name", name, kMaxTokenFieldNameBytes);
          !bad.ok()) {
        return Invalid(bad.message());
      }
      ASSIGN_OR_RETURN(ArrayView view, ViewArray(array, what));
      if (view.rank() < 1 || view.dim(0) != n_) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " has first dimension ", view.rank() < 1 ? 0 : view.dim(0),
            ", must be n = ", n_, " (one entry per token)"));
      }
      if (view.rank() > kMaxTokenFieldRank) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " has rank ", view.rank(), ", at most ", kMaxTokenFieldRank,
            " (n and 16 more dimensions)"));
      }
      const int64_t per_token = n_ > 0 ? view.num_elements() / n_ : 1;
      StoredField field;
      field.dtype = view.dtype;
      field.trailing_shape.assign(view.shape.begin() + 1, view.shape.end());
      const DeclaredTokenField* declared = nullptr;
      for (const DeclaredTokenField& f : declared_) {
        if (f.name == name) declared = &f;
      }
      if (declared != nullptr && declared->dtype != view.dtype) {
        // A widening conversion makes bytes the message's size limits never
        // counted: bounded per message, before the allocation.
        const int64_t growth = view.num_elements() * (DTypeSize(declared->dtype) - DTypeSize(view.dtype));
        if (growth_budget_ != nullptr && growth > 0) {
          if (growth > *growth_budget_) {
            return absl::InvalidArgumentError(absl::StrCat(
                what, " is ", DTypeName(view.dtype), ": converting it to the pool's ",
                DTypeName(declared->dtype), " adds ", growth, " bytes, past what this message's "
                "conversions may add (", *growth_budget_, " bytes left of as many as the message "
                "has); send the declared dtype or smaller messages"));
          }
          *growth_budget_ -= growth;
        }
        ASSIGN_OR_RETURN(field.data, ConvertTokenField(view, *declared, what, per_token));
        field.dtype = declared->dtype;
      } else if (view.dtype == v1::FLOAT64) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " is float64, which a pool takes only into a field it declares float32 with "
            "allow_narrowing (PoolOptions.token_fields; docs/producer.md#token-field-schema)"));
      } else if (owned_ != nullptr) {
        field.data = std::move(*owned_->mutable_token_fields()->at(name).mutable_data());
      } else {
        field.data.assign(view.data.data(), view.data.size());
      }
      if (std::find(model_.finite_token_fields.begin(), model_.finite_token_fields.end(), name) !=
          model_.finite_token_fields.end()) {
        if (auto bad = FirstNonFinite(field.dtype, field.data); bad.has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, " is ", bad->second, " at token ", bad->first / std::max<int64_t>(per_token, 1),
              " (element ", bad->first, "); the pool requires finite values in this field "
              "(ModelSpec.finite_token_fields)"));
        }
      }
      out.token_fields.emplace(name, std::move(field));
    }
    return absl::OkStatus();
  }

  const v1::Sample& sample_;
  v1::Sample* const owned_;
  const ModelSpec& model_;
  const absl::Span<const DeclaredTokenField> declared_;
  int64_t* const growth_budget_;
  const std::string who_;
  bool out_piece() const { return sample_.partial() || sample_.piece() != 0; }
  // A piece after the first: it may carry no tokens and no rows.
  bool later_piece_ = false;
  // Token position of the first row kept (a piece keeps its rows alone)
  // and how many rows are kept.
  int64_t base_ = 0;
  int64_t out_rows_ = 0;
  int64_t n_ = 0;
  // Global layer ids of the stored layer axis: M, then N..N+D-1 with
  // mtp_routing.
  std::vector<int> stored_ids_;
};

}  // namespace

absl::StatusOr<StoredSample> ValidateSample(const v1::Sample& sample, const ModelSpec& model,
                                            absl::Span<const DeclaredTokenField> declared,
                                            int64_t* growth_budget) {
  return SampleValidator(sample, model, declared, growth_budget, nullptr).Run();
}

absl::StatusOr<StoredSample> ValidateAndTakeSample(v1::Sample* sample, const ModelSpec& model,
                                                   absl::Span<const DeclaredTokenField> declared,
                                                   int64_t* growth_budget) {
  return SampleValidator(*sample, model, declared, growth_budget, sample).Run();
}

}  // namespace rollpack
