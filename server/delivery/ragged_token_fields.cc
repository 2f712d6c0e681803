#include "server/delivery/ragged_token_fields.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "proto/wire/wire_format.h"
#include "rollpack/v1/trainer.pb.h"
#include "scheduler/layout_gather.h"
#include "scheduler/ragged_gather.h"
#include "server/store/ndarray.h"

namespace rollpack {
namespace {

constexpr int kMapKeyField = 1;       // map entry key
constexpr int kMapValueField = 2;     // map entry value
constexpr int kValuesField = 1;       // RaggedArray.values
constexpr int kOffsetsField = 2;      // RaggedArray.offsets
constexpr int kNDArrayDataField = 3;  // NDArray.data

using wire::LengthDelimitedSize;
using wire::WriteLengthDelimitedHeader;

std::string SerializedArrayHead(v1::DType dtype, int64_t length) {
  v1::NDArray head;
  head.set_dtype(dtype);
  head.add_shape(length);
  return head.SerializeAsString();
}

// An NDArray of `head` and `data` bytes: proto3 leaves empty bytes out.
size_t ArraySize(const std::string& head, size_t data) {
  return head.size() + (data > 0 ? LengthDelimitedSize(kNDArrayDataField, data) : 0);
}

RaggedSource SourceOf(const StoredRagged& field) {
  return {field.offsets, field.values.data(), field.values.size()};
}

}  // namespace

void RaggedTokenFieldsEncoder::Clear() {
  fields_.clear();
  runs_ = {};
  rows_ = 0;
  encoded_size_ = 0;
}

absl::Status RaggedTokenFieldsEncoder::CheckSample(const Step& step, int seq,
                                                   const StoredSample& sample) const {
  auto fail = [&](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("step \"", step.step_id, "\": sample \"", step.sample_ids[seq], "\" ", what));
  };
  if (sample.ragged_fields.size() != fields_.size()) {
    return fail(absl::StrCat("holds ", sample.ragged_fields.size(),
                             " ragged token fields, the micro-batch's other samples ",
                             fields_.size()));
  }
  for (const Field& field : fields_) {
    auto it = sample.ragged_fields.find(field.name);
    if (it == sample.ragged_fields.end()) {
      return fail(absl::StrCat("lacks ragged_token_fields[\"", field.name, "\"]"));
    }
    const StoredRagged& ragged = it->second;
    if (ragged.dtype != field.dtype) {
      return fail(absl::StrCat("holds ragged_token_fields[\"", field.name, "\"] as ",
                               DTypeName(ragged.dtype), ", the micro-batch's other samples as ",
                               DTypeName(field.dtype)));
    }
    const int64_t held = static_cast<int64_t>(ragged.values.size());
    if (ragged.offsets.empty() || ragged.num_tokens() != sample.num_tokens() ||
        ragged.offsets.front() != 0 || ragged.offsets.back() < 0 ||
        held != ragged.offsets.back() * static_cast<int64_t>(field.value_bytes)) {
      return fail(absl::StrCat("holds ragged_token_fields[\"", field.name, "\"] of ",
                               ragged.num_tokens(), " tokens and ", held,
                               " bytes of values, its tokens are ", sample.num_tokens()));
    }
  }
  return absl::OkStatus();
}

absl::Status RaggedTokenFieldsEncoder::Prepare(
    const Step& step, absl::Span<const std::shared_ptr<const StoredSample>> samples,
    absl::Span<const int> sequences, int schema, absl::Span<const RowRun> runs) {
  Clear();
  samples_ = samples;
  sequences_ = sequences;
  const StoredSample& first = *samples[sequences[schema]];
  if (first.ragged_fields.empty()) return absl::OkStatus();
  // std::map order: the deterministic serialization's key order.
  for (const auto& [name, ragged] : first.ragged_fields) {
    Field& field = fields_.emplace_back();
    field.name = name;
    field.dtype = ragged.dtype;
    field.value_bytes = static_cast<size_t>(DTypeSize(ragged.dtype));
    if (field.value_bytes == 0) {
      return absl::DataLossError(absl::StrCat(
          "step \"", step.step_id, "\": sample \"", step.sample_ids[sequences[schema]],
          "\" holds ragged_token_fields[\"", name, "\"] as ", DTypeName(ragged.dtype)));
    }
  }
  // Each sample the runs read, once: its fields must fit its tokens before
  // a run reads them.
  std::vector<bool> checked(sequences.size(), false);
  for (const RowRun& run : runs) {
    if (run.padding || checked[run.ordinal]) continue;
    checked[run.ordinal] = true;
    RETURN_IF_ERROR(CheckSample(step, sequences[run.ordinal], *samples[sequences[run.ordinal]]));
  }
  runs_ = runs;
  rows_ = TotalRows(runs);
  for (Field& field : fields_) {
    absl::StatusOr<int64_t> values = CountRaggedValues(runs, field.value_bytes, [&](int ordinal) {
      return SourceOf(samples[sequences[ordinal]]->ragged_fields.at(field.name));
    });
    if (!values.ok()) {  // offsets that decrease: the store never holds such
      return absl::DataLossError(absl::StrCat("step \"", step.step_id, "\": ragged_token_fields[\"",
                                              field.name, "\"]: ", values.status().message()));
    }
    field.values = *values;
    field.values_head = SerializedArrayHead(field.dtype, field.values);
    field.offsets_head = SerializedArrayHead(v1::INT64, rows_ + 1);
    encoded_size_ +=
        LengthDelimitedSize(v1::Microbatch::kRaggedTokenFieldsFieldNumber, SizesOf(field).entry);
  }
  return absl::OkStatus();
}

RaggedTokenFieldsEncoder::Sizes RaggedTokenFieldsEncoder::SizesOf(const Field& field) const {
  Sizes sizes;
  sizes.values_array =
      ArraySize(field.values_head, static_cast<size_t>(field.values) * field.value_bytes);
  sizes.offsets_array =
      ArraySize(field.offsets_head, static_cast<size_t>(rows_ + 1) * sizeof(int64_t));
  sizes.ragged = LengthDelimitedSize(kValuesField, sizes.values_array) +
                 LengthDelimitedSize(kOffsetsField, sizes.offsets_array);
  // A map entry: protobuf writes key and value even when default.
  sizes.entry = LengthDelimitedSize(kMapKeyField, field.name.size()) +
                LengthDelimitedSize(kMapValueField, sizes.ragged);
  return sizes;
}

absl::Status RaggedTokenFieldsEncoder::Encode(absl::Span<uint8_t> out) const {
  if (out.size() != encoded_size_) {
    return absl::InvalidArgumentError(absl::StrCat("encode ragged token fields: output has ",
                                                   out.size(), " bytes, the encoding needs ",
                                                   encoded_size_));
  }
  uint8_t* p = out.data();
  for (const Field& field : fields_) {
    const Sizes sizes = SizesOf(field);
    p = WriteLengthDelimitedHeader(v1::Microbatch::kRaggedTokenFieldsFieldNumber, sizes.entry, p);
    p = WriteLengthDelimitedHeader(kMapKeyField, field.name.size(), p);
    std::memcpy(p, field.name.data(), field.name.size());
    p += field.name.size();
    p = WriteLengthDelimitedHeader(kMapValueField, sizes.ragged, p);

    const size_t values_bytes = static_cast<size_t>(field.values) * field.value_bytes;
    p = WriteLengthDelimitedHeader(kValuesField, sizes.values_array, p);
    std::memcpy(p, field.values_head.data(), field.values_head.size());
    p += field.values_head.size();
    if (values_bytes > 0) p = WriteLengthDelimitedHeader(kNDArrayDataField, values_bytes, p);
    const absl::Span<uint8_t> values(p, values_bytes);
    p += values_bytes;

    const size_t offsets_bytes = static_cast<size_t>(rows_ + 1) * sizeof(int64_t);
    p = WriteLengthDelimitedHeader(kOffsetsField, sizes.offsets_array, p);
    std::memcpy(p, field.offsets_head.data(), field.offsets_head.size());
    p += field.offsets_head.size();
    p = WriteLengthDelimitedHeader(kNDArrayDataField, offsets_bytes, p);
    const absl::Span<uint8_t> offsets(p, offsets_bytes);
    p += offsets_bytes;

    RETURN_IF_ERROR(GatherRagged(
        runs_, field.value_bytes,
        [&](int ordinal) {
          return SourceOf(samples_[sequences_[ordinal]]->ragged_fields.at(field.name));
        },
        values, offsets));
  }
  if (p != out.data() + out.size()) {
    return absl::InternalError(absl::StrCat("encode ragged token fields: wrote ", p - out.data(),
                                            " bytes, sized ", encoded_size_));
  }
  return absl::OkStatus();
}

}  // namespace rollpack
