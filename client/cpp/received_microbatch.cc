#include "client/cpp/received_microbatch.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace rollpack {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;
using google::protobuf::internal::WireFormatLite;

namespace {

// Reads gRPC slices in order without copying them.
class SliceInputStream final : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit SliceInputStream(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  bool Next(const void** data, int* size) override {
    if (backed_up_ > 0) {
      const grpc::Slice& s = slices_[index_ - 1];
      *data = s.begin() + s.size() - backed_up_;
      *size = static_cast<int>(backed_up_);
      count_ += backed_up_;
      backed_up_ = 0;
      return true;
    }
    while (index_ < slices_.size() && slices_[index_].size() == 0) ++index_;
    if (index_ == slices_.size()) return false;
    const grpc::Slice& s = slices_[index_++];
    *data = s.begin();
    *size = static_cast<int>(s.size());
    count_ += static_cast<int64_t>(s.size());
    return true;
  }

  void BackUp(int count) override {
    backed_up_ += count;
    count_ -= count;
  }

  bool Skip(int count) override {
    const void* data;
    int size;
    while (count > 0) {
      if (!Next(&data, &size)) return false;
      if (size > count) {
        BackUp(size - count);
        return true;
      }
      count -= size;
    }
    return true;
  }

  int64_t ByteCount() const override { return count_; }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  int64_t backed_up_ = 0;  // of slices_[index_ - 1], handed out again next
  int64_t count_ = 0;
};

constexpr uint32_t LengthDelimitedTag(int field) {
  return WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}

// Microbatch's NDArray fields (trainer.proto) by field number.
const char* ArrayName(int field) {
  switch (field) {
    case 6: return "cu_seqlens";
    case 7: return "cu_seqlens_padded";
    case 9: return "tokens";
    case 11: return "replay_experts";
    case 12: return "replay_mask";
    default: return nullptr;
  }
}

v1::NDArray* MutableArray(v1::Microbatch* m, absl::string_view name) {
  if (absl::ConsumePrefix(&name, kRaggedValuesPrefix)) {
    return (*m->mutable_ragged_token_fields())[std::string(name)].mutable_values();
  }
  if (absl::ConsumePrefix(&name, kRaggedOffsetsPrefix)) {
    return (*m->mutable_ragged_token_fields())[std::string(name)].mutable_offsets();
  }
  if (name == "tokens") return m->mutable_tokens();
  if (name == "cu_seqlens") return m->mutable_cu_seqlens();
  if (name == "cu_seqlens_padded") return m->mutable_cu_seqlens_padded();
  if (name == "replay_experts") return m->mutable_replay_experts();
  if (name == "replay_mask") return m->mutable_replay_mask();
  return &(*m->mutable_token_fields())[std::string(
      name.substr(ReceivedMicrobatch::kFieldPrefix.size()))];
}

}  // namespace

// One NDArray while parsing: everything but `data` kept as encoded (merged
// occurrences concatenate, as protobuf merges them), `data` located.
struct PendingArray {
  std::string head;
  int64_t data_offset = 0;
  int64_t data_size = 0;
};

// One RaggedArray while parsing: its fields other than the two arrays as
// encoded (unknown ones, kept as protobuf keeps them), and the arrays.
struct PendingRagged {
  std::string head;
  std::optional<PendingArray> values;
  std::optional<PendingArray> offsets;
};

class MicrobatchWireParser {
 public:
  explicit MicrobatchWireParser(ReceivedMicrobatch* out) : out_(out) {}

  absl::Status Run() {
    SliceInputStream stream(out_->slices_);
    CodedInputStream in(&stream);
    in.SetTotalBytesLimit(INT_MAX);
    std::string rest;  // the fields that are not arrays, as encoded
    {
      StringOutputStream rest_stream(&rest);
      CodedOutputStream rest_out(&rest_stream);
      while (true) {
        uint32_t tag = 0;
        if (!ReadTag(&in, &tag)) return Error(in, "a field tag");
        if (tag == 0) break;
        const int field = WireFormatLite::GetTagFieldNumber(tag);
        const char* array = ArrayName(field);
        if (array != nullptr && tag == LengthDelimitedTag(field)) {
          if (!ParseArray(&in, &arrays_[array], 1)) return Error(in, array);
        } else if (tag == LengthDelimitedTag(10)) {
          if (!ParseTokenFieldEntry(&in)) return Error(in, "token_fields");
        } else if (tag == LengthDelimitedTag(21)) {
          if (!ParseRaggedFieldEntry(&in)) return Error(in, "ragged_token_fields");
        } else if (!SkipField(&in, tag, &rest_out)) {
          return Error(in, absl::StrCat("field ", field));
        }
      }
      if (!in.ConsumedEntireMessage()) return Error(in, "a field tag");
    }
    if (!out_->meta_.ParseFromString(rest)) {
      return absl::DataLossError("received micro-batch: its fields other than the arrays do not parse");
    }
    for (auto& [name, pending] : arrays_) {
      v1::NDArray* array = MutableArray(&out_->meta_, name);
      if (!array->ParseFromString(pending.head)) {
        return absl::DataLossError(absl::StrCat("received micro-batch: array ", name,
                                                " does not parse"));
      }
      Locate(name, pending);
    }
    for (auto& [key, pending] : ragged_) {
      v1::RaggedArray& ragged = (*out_->meta_.mutable_ragged_token_fields())[key];
      if (!ragged.ParseFromString(pending.head) ||
          (pending.values.has_value() &&
           !ragged.mutable_values()->ParseFromString(pending.values->head)) ||
          (pending.offsets.has_value() &&
           !ragged.mutable_offsets()->ParseFromString(pending.offsets->head))) {
        return absl::DataLossError(absl::StrCat("received micro-batch: ragged_token_fields[\"", key,
                                                "\"] does not parse"));
      }
      if (pending.values.has_value()) Locate(RaggedValuesName(key), *pending.values);
      if (pending.offsets.has_value()) Locate(RaggedOffsetsName(key), *pending.offsets);
    }
    return absl::OkStatus();
  }

 private:
  void Locate(const std::string& name, const PendingArray& pending) {
    ReceivedMicrobatch::ArrayData& data = out_->data_[name];
    data.size = pending.data_size;
    data.segments = {{{pending.data_offset, pending.data_size}, 0}};
  }

  static absl::Status Error(const CodedInputStream& in, absl::string_view what) {
    return absl::DataLossError(absl::StrCat("received micro-batch does not parse: ", what,
                                            " at byte ", in.CurrentPosition()));
  }

  // A nested message ends at its length, not earlier at the end of the
  // bytes (which CodedInputStream also reports as a clean end).
  static bool EndsAtLimit(CodedInputStream* in) {
    return in->ConsumedEntireMessage() && in->BytesUntilLimit() == 0;
  }

  // A nested message's length, which must fit in the message around it
  // (PushLimit would silently shorten it to that).
  static bool ReadLength(CodedInputStream* in, int* length) {
    if (!ReadSize(in, length)) return false;
    const int room = in->BytesUntilLimit();
    return room < 0 || *length <= room;
  }

  // protobuf's parser reads tags and sizes of at most 5 bytes, where
  // CodedInputStream reads longer varints and drops their high bits.
  // It refuses field number 0 too (a tag below 8 other than the end's 0).
  static bool ReadTag(CodedInputStream* in, uint32_t* tag) {
    const int start = in->CurrentPosition();
    *tag = in->ReadTag();
    if (*tag != 0 && WireFormatLite::GetTagFieldNumber(*tag) == 0) return false;
    return in->CurrentPosition() - start <= 5;
  }
  static bool ReadSize(CodedInputStream* in, int* size) {
    const int start = in->CurrentPosition();
    uint32_t n = 0;
    if (!in->ReadVarint32(&n) || n > INT_MAX || in->CurrentPosition() - start > 5) return false;
    *size = static_cast<int>(n);
    return true;
  }

  // WireFormatLite::SkipField, but with protobuf's parser's limits inside
  // groups too: tags and sizes of at most 5 bytes, groups nested at most
  // 100 deep, an end-group tag only where its group ends (SkipField reads a
  // group's tags with CodedInputStream, which takes longer varints; found by
  // fuzz/received_microbatch_fuzzer). `out` (may be null) gets the field.
  static bool SkipField(CodedInputStream* in, uint32_t tag, CodedOutputStream* out,
                        int depth = 0) {
    switch (WireFormatLite::GetTagWireType(tag)) {
      case WireFormatLite::WIRETYPE_VARINT:
      case WireFormatLite::WIRETYPE_FIXED64:
      case WireFormatLite::WIRETYPE_FIXED32:
        return out != nullptr ? WireFormatLite::SkipField(in, tag, out)
                              : WireFormatLite::SkipField(in, tag);
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
        int size = 0;
        std::string bytes;
        if (!ReadSize(in, &size) || !in->ReadString(&bytes, size)) return false;
        if (out != nullptr) {
          out->WriteTag(tag);
          out->WriteVarint32(static_cast<uint32_t>(size));
          out->WriteString(bytes);
        }
        return true;
      }
      case WireFormatLite::WIRETYPE_START_GROUP: {
        if (depth >= 100) return false;
        if (out != nullptr) out->WriteTag(tag);
        const int field = WireFormatLite::GetTagFieldNumber(tag);
        while (true) {
          uint32_t inner = 0;
          if (!ReadTag(in, &inner) || inner == 0) return false;
          if (WireFormatLite::GetTagWireType(inner) == WireFormatLite::WIRETYPE_END_GROUP) {
            if (WireFormatLite::GetTagFieldNumber(inner) != field) return false;
            if (out != nullptr) out->WriteTag(inner);
            return true;
          }
          if (!SkipField(in, inner, out, depth + 1)) return false;
        }
      }
      default:  // an end-group tag outside its group, or wire types 6 and 7
        return false;
    }
  }

  // `depth`: messages around the array (protobuf's recursion limit counts them).
  static bool ParseArray(CodedInputStream* in, PendingArray* array, int depth) {
    int length = 0;
    if (!ReadLength(in, &length)) return false;
    const CodedInputStream::Limit limit = in->PushLimit(length);
    StringOutputStream head_stream(&array->head);
    CodedOutputStream head_out(&head_stream);
    while (true) {
      uint32_t tag = 0;
      if (!ReadTag(in, &tag)) return false;
      if (tag == 0) break;
      if (tag == LengthDelimitedTag(3)) {
        int size = 0;
        if (!ReadSize(in, &size)) return false;
        const int64_t offset = in->CurrentPosition();
        if (!in->Skip(size)) return false;
        array->data_offset = offset;
        array->data_size = size;
      } else if (!SkipField(in, tag, &head_out, depth)) {
        return false;
      }
    }
    if (!EndsAtLimit(in)) return false;
    in->PopLimit(limit);
    return true;
  }

  // A map entry {1: key, 2: value} into `key` and `value` (parsed by
  // `parse_value`): within an entry the last key wins and values merge.
  // `entry_name` is the entry message's full name, for the UTF-8 check.
  template <typename Value, typename ParseValue>
  static bool ParseMapEntry(CodedInputStream* in, const char* entry_name, std::string* key,
                            Value* value, ParseValue parse_value) {
    int length = 0;
    if (!ReadLength(in, &length)) return false;
    const CodedInputStream::Limit limit = in->PushLimit(length);
    while (true) {
      uint32_t tag = 0;
      if (!ReadTag(in, &tag)) return false;
      if (tag == 0) break;
      if (tag == LengthDelimitedTag(1)) {
        int size = 0;
        if (!ReadSize(in, &size) || !in->ReadString(key, size)) return false;
        // Every occurrence, as protobuf checks each key it reads.
        if (!WireFormatLite::VerifyUtf8String(key->data(), static_cast<int>(key->size()),
                                              WireFormatLite::PARSE, entry_name)) {
          return false;
        }
      } else if (tag == LengthDelimitedTag(2)) {
        if (!parse_value(in, value)) return false;
      } else if (!SkipField(in, tag, nullptr, 1)) {
        return false;
      }
    }
    if (!EndsAtLimit(in)) return false;
    in->PopLimit(limit);
    return true;
  }

  // A token_fields entry: the last entry of a key replaces the earlier ones.
  bool ParseTokenFieldEntry(CodedInputStream* in) {
    std::string key;
    PendingArray value;
    if (!ParseMapEntry(in, "rollpack.v1.Microbatch.TokenFieldsEntry.key", &key, &value,
                       [](CodedInputStream* in, PendingArray* v) { return ParseArray(in, v, 2); })) {
      return false;
    }
    // protobuf parses an entry's value even when a later entry of the same
    // key replaces it, so a malformed value refuses the message either way.
    if (v1::NDArray checked; !checked.ParseFromString(value.head)) return false;
    arrays_[absl::StrCat(ReceivedMicrobatch::kFieldPrefix, key)] = std::move(value);
    return true;
  }

  // A RaggedArray {1: values, 2: offsets}; repeated occurrences merge, as
  // protobuf merges a message field. `depth` as for ParseArray.
  static bool ParseRagged(CodedInputStream* in, PendingRagged* ragged, int depth) {
    int length = 0;
    if (!ReadLength(in, &length)) return false;
    const CodedInputStream::Limit limit = in->PushLimit(length);
    StringOutputStream head_stream(&ragged->head);
    CodedOutputStream head_out(&head_stream);
    while (true) {
      uint32_t tag = 0;
      if (!ReadTag(in, &tag)) return false;
      if (tag == 0) break;
      if (tag == LengthDelimitedTag(1) || tag == LengthDelimitedTag(2)) {
        std::optional<PendingArray>& array =
            tag == LengthDelimitedTag(1) ? ragged->values : ragged->offsets;
        if (!array.has_value()) array.emplace();
        if (!ParseArray(in, &*array, depth + 1)) return false;
      } else if (!SkipField(in, tag, &head_out, depth)) {
        return false;
      }
    }
    if (!EndsAtLimit(in)) return false;
    in->PopLimit(limit);
    return true;
  }

  // A ragged_token_fields entry {1: key, 2: RaggedArray}, as
  // ParseTokenFieldEntry reads a token_fields entry.
  bool ParseRaggedFieldEntry(CodedInputStream* in) {
    std::string key;
    PendingRagged value;
    if (!ParseMapEntry(in, "rollpack.v1.Microbatch.RaggedTokenFieldsEntry.key", &key, &value,
                       [](CodedInputStream* in, PendingRagged* v) { return ParseRagged(in, v, 2); })) {
      return false;
    }
    // Parsed (and refused when malformed) even when a later entry of the
    // same key replaces it, as protobuf does.
    if (v1::RaggedArray checked; !checked.ParseFromString(value.head)) return false;
    for (const std::optional<PendingArray>* array : {&value.values, &value.offsets}) {
      if (v1::NDArray checked; array->has_value() && !checked.ParseFromString((*array)->head)) {
        return false;
      }
    }
    ragged_[key] = std::move(value);
    return true;
  }

  ReceivedMicrobatch* const out_;
  std::map<std::string, PendingArray> arrays_;
  std::map<std::string, PendingRagged> ragged_;
};

absl::StatusOr<ReceivedMicrobatch> ReceivedMicrobatch::Parse(const grpc::ByteBuffer& buffer) {
  ReceivedMicrobatch m;
  if (grpc::Status s = buffer.Dump(&m.slices_); !s.ok()) {
    return absl::DataLossError(absl::StrCat("received micro-batch: ", s.error_message()));
  }
  m.slice_offsets_.reserve(m.slices_.size());
  for (const grpc::Slice& s : m.slices_) {
    m.slice_offsets_.push_back(m.wire_bytes_);
    m.wire_bytes_ += static_cast<int64_t>(s.size());
  }
  if (m.wire_bytes_ > INT_MAX) {
    return absl::DataLossError(
        absl::StrCat("received micro-batch of ", m.wire_bytes_, " bytes: over 2 GiB"));
  }
  MicrobatchWireParser parser(&m);
  RETURN_IF_ERROR(parser.Run());
  return m;
}

const ReceivedMicrobatch::ArrayData* ReceivedMicrobatch::Find(absl::string_view array) const {
  auto it = data_.find(array);
  return it == data_.end() ? nullptr : &it->second;
}

int64_t ReceivedMicrobatch::data_size(absl::string_view array) const {
  const ArrayData* a = Find(array);
  return a == nullptr ? -1 : a->size;
}

template <typename Fn>
void ReceivedMicrobatch::ForEachPiece(Range range, Fn piece) const {
  if (range.size == 0) return;
  size_t i = static_cast<size_t>(
      std::upper_bound(slice_offsets_.begin(), slice_offsets_.end(), range.offset) -
      slice_offsets_.begin() - 1);
  int64_t at = range.offset - slice_offsets_[i];
  int64_t left = range.size;
  for (; left > 0; ++i, at = 0) {
    const int64_t n = std::min<int64_t>(left, static_cast<int64_t>(slices_[i].size()) - at);
    piece(reinterpret_cast<const char*>(slices_[i].begin()) + at, n);
    left -= n;
  }
}

void ReceivedMicrobatch::CopyData(absl::string_view array, void* out) const {
  const ArrayData* a = Find(array);
  if (a == nullptr) return;
  for (const Segment& segment : a->segments) {
    char* to = static_cast<char*>(out) + segment.to;
    ForEachPiece(segment.from, [&to](const char* from, int64_t n) {
      std::memcpy(to, from, n);
      to += n;
    });
  }
}

absl::StatusOr<RaggedShape> ReceivedMicrobatch::CheckRagged(absl::string_view field) const {
  auto it = meta_.ragged_token_fields().find(std::string(field));
  const std::string where = absl::StrCat("micro-batch ", meta_.index());
  if (it == meta_.ragged_token_fields().end()) {
    return absl::NotFoundError(absl::StrCat(where, " has no ragged_token_fields[\"", field, "\"]"));
  }
  ASSIGN_OR_RETURN(RaggedShape shape, ReadRaggedShape(where, field, it->second));
  const ArrayData* values = Find(RaggedValuesName(field));
  const int64_t values_bytes = values == nullptr ? 0 : values->size;
  if (values_bytes != shape.values_bytes()) {
    return absl::DataLossError(
        absl::StrCat(where, ": ragged_token_fields[\"", field, "\"]: values holds ", values_bytes,
                     " bytes, its ", shape.num_values, " ", v1::DType_Name(shape.values_dtype),
                     " need ", shape.values_bytes()));
  }
  RaggedOffsetsCheck check(shape.rows, shape.num_values);
  if (const ArrayData* offsets = Find(RaggedOffsetsName(field)); offsets != nullptr) {
    for (const Segment& segment : offsets->segments) {
      ForEachPiece(segment.from, [&check](const char* from, int64_t n) { check.Feed(from, n); });
    }
  }
  RETURN_IF_ERROR(check.Finish(where, field));
  return shape;
}

v1::Microbatch ReceivedMicrobatch::ToMessage() const {
  v1::Microbatch m = meta_;
  for (const auto& [name, array] : data_) {
    std::string* data = MutableArray(&m, name)->mutable_data();
    data->reserve(array.size);
    // The segments tile the array in order: appending them is the scatter.
    for (const Segment& segment : array.segments) {
      ForEachPiece(segment.from, [data](const char* from, int64_t n) { data->append(from, n); });
    }
  }
  return m;
}

}  // namespace rollpack
