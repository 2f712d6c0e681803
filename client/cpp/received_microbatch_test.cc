// ReceivedMicrobatch against protobuf's own parser: the same message for any
// valid encoding cut into slices anywhere, the same refusals for bytes that
// are not a Microbatch, and each array's bytes located exactly.
#include "client/cpp/received_microbatch.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "proto/wire/deterministic_bytes.h"

namespace rollpack {
namespace {

std::string Bytes(std::mt19937& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

v1::NDArray Array(std::mt19937& rng, v1::DType dtype, std::vector<int64_t> shape, int elem) {
  v1::NDArray a;
  a.set_dtype(dtype);
  int64_t n = 1;
  for (int64_t d : shape) {
    a.add_shape(d);
    n *= d;
  }
  a.set_data(Bytes(rng, static_cast<size_t>(n * elem)));
  return a;
}

// A ragged field of `rows` lists of 0..4 ids (layout.md section 13).
v1::RaggedArray RandomRagged(std::mt19937& rng, int rows, v1::DType dtype) {
  std::vector<int64_t> offsets{0};
  for (int r = 0; r < rows; ++r)
    offsets.push_back(offsets.back() + static_cast<int64_t>(rng() % 5));
  v1::RaggedArray a;
  *a.mutable_values() = Array(rng, dtype, {offsets.back()}, dtype == v1::UINT16 ? 2 : 4);
  a.mutable_offsets()->set_dtype(v1::INT64);
  a.mutable_offsets()->add_shape(rows + 1);
  a.mutable_offsets()->set_data(
      std::string(reinterpret_cast<const char*>(offsets.data()), offsets.size() * 8));
  return a;
}

v1::Microbatch RandomMicrobatch(std::mt19937& rng, int rows) {
  v1::Microbatch m;
  m.set_step_id("step-7");
  m.set_index(3);
  m.set_num_microbatches(9);
  m.set_local_cp_size(2);
  m.set_local_cp_rank(1);
  m.add_sample_ids("s1");
  m.add_sample_ids("s17");
  *m.mutable_cu_seqlens() = Array(rng, v1::INT32, {3}, 4);
  *m.mutable_cu_seqlens_padded() = Array(rng, v1::INT32, {3}, 4);
  m.set_max_seqlen(rows);
  *m.mutable_tokens() = Array(rng, v1::INT32, {rows}, 4);
  (*m.mutable_token_fields())["logprobs"] = Array(rng, v1::FLOAT32, {rows}, 4);
  (*m.mutable_token_fields())["loss_mask"] = Array(rng, v1::UINT8, {rows}, 1);
  (*m.mutable_ragged_token_fields())["sampling_mask"] = RandomRagged(rng, rows, v1::UINT16);
  (*m.mutable_ragged_token_fields())["kept"] = RandomRagged(rng, rows, v1::INT32);
  *m.mutable_replay_experts() = Array(rng, v1::UINT8, {rows, 6, 8}, 1);
  *m.mutable_replay_mask() = Array(rng, v1::UINT8, {rows}, 1);
  for (int l : {3, 4, 5, 6, 7, 8}) m.add_replay_layers(l);
  m.set_workload(1234.5);
  // Per sequence (lifecycle.md section 6): held whole in meta(), the
  // header piece's alone on FetchPieces streams.
  m.add_group_ids("q0");
  m.add_group_ids("");
  m.add_policy_versions(3);
  m.add_policy_versions(-1);
  (*m.mutable_scalars())["reward"] = Array(rng, v1::FLOAT64, {2}, 8);
  (*m.mutable_scalars())["len_penalty"] = Array(rng, v1::FLOAT64, {2}, 8);
  *m.mutable_advantages() = Array(rng, v1::FLOAT32, {2}, 4);
  return m;
}

// `bytes` cut at the given offsets into gRPC slices (empty ones included).
grpc::ByteBuffer Buffer(const std::string& bytes, std::vector<size_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t cut : cuts) {
    cut = std::min(cut, bytes.size());
    slices.emplace_back(bytes.data() + at, cut - at);
    at = cut;
  }
  slices.emplace_back(bytes.data() + at, bytes.size() - at);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::vector<size_t> RandomCuts(std::mt19937& rng, size_t size, int count) {
  std::vector<size_t> cuts;
  for (int i = 0; i < count; ++i) cuts.push_back(size == 0 ? 0 : rng() % (size + 1));
  return cuts;
}

const char* const kArrays[] = {"tokens", "cu_seqlens", "cu_seqlens_padded", "replay_experts",
                               "replay_mask"};

TEST(ReceivedMicrobatchTest, CanonicalBytesInAnySlicingGiveTheSameMessageAndArrays) {
  std::mt19937 rng(1);
  const v1::Microbatch m = RandomMicrobatch(rng, 300);
  const std::string bytes = m.SerializeAsString();
  for (int trial = 0; trial < 200; ++trial) {
    // One slice, one byte a slice, and random cuts (also inside tags/lengths).
    std::vector<size_t> cuts;
    if (trial == 1) {
      for (size_t i = 1; i < bytes.size(); ++i) cuts.push_back(i);
    } else if (trial > 1) {
      cuts = RandomCuts(rng, bytes.size(), 1 + trial % 40);
    }
    absl::StatusOr<ReceivedMicrobatch> r = ReceivedMicrobatch::Parse(Buffer(bytes, cuts));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->wire_bytes(), static_cast<int64_t>(bytes.size()));
    ASSERT_TRUE(DeterministicBytes(r->ToMessage()) == DeterministicBytes(m)) << "trial " << trial;

    auto check = [&](const std::string& name, const v1::NDArray& sent) {
      const v1::NDArray& meta = name.rfind("field:", 0) == 0
                                    ? r->meta().token_fields().at(name.substr(6))
                                    : name == "tokens" ? r->meta().tokens()
                                    : name == "cu_seqlens" ? r->meta().cu_seqlens()
                                    : name == "cu_seqlens_padded" ? r->meta().cu_seqlens_padded()
                                    : name == "replay_experts" ? r->meta().replay_experts()
                                                               : r->meta().replay_mask();
      EXPECT_TRUE(meta.data().empty()) << name;
      EXPECT_EQ(meta.dtype(), sent.dtype()) << name;
      EXPECT_EQ(meta.shape_size(), sent.shape_size()) << name;
      ASSERT_EQ(r->data_size(name), static_cast<int64_t>(sent.data().size())) << name;
      std::string out(sent.data().size(), '\0');
      r->CopyData(name, out.data());
      EXPECT_EQ(out, sent.data()) << name;
    };
    check("tokens", m.tokens());
    check("cu_seqlens", m.cu_seqlens());
    check("cu_seqlens_padded", m.cu_seqlens_padded());
    check("replay_experts", m.replay_experts());
    check("replay_mask", m.replay_mask());
    check("field:logprobs", m.token_fields().at("logprobs"));
    check("field:loss_mask", m.token_fields().at("loss_mask"));
    EXPECT_EQ(r->data_size("field:absent"), -1);
    // Ragged fields: both arrays located, the heads in meta(), and checked.
    for (const auto& [name, sent] : m.ragged_token_fields()) {
      const v1::RaggedArray& meta = r->meta().ragged_token_fields().at(name);
      for (const auto& [array, got, want] :
           {std::tuple(RaggedValuesName(name), &meta.values(), &sent.values()),
            std::tuple(RaggedOffsetsName(name), &meta.offsets(), &sent.offsets())}) {
        EXPECT_TRUE(got->data().empty()) << array;
        EXPECT_EQ(got->dtype(), want->dtype()) << array;
        ASSERT_EQ(r->data_size(array), static_cast<int64_t>(want->data().size())) << array;
        std::string out(want->data().size(), '\0');
        r->CopyData(array, out.data());
        EXPECT_EQ(out, want->data()) << array;
      }
      absl::StatusOr<RaggedShape> shape = r->CheckRagged(name);
      ASSERT_TRUE(shape.ok()) << shape.status();
      EXPECT_EQ(shape->rows, 300);
      EXPECT_EQ(shape->values_dtype, sent.values().dtype());
      EXPECT_EQ(shape->num_values, sent.values().shape(0));
    }
  }
}

// CheckRagged trusts nothing: forged offsets, sizes and dtypes are refused
// naming the micro-batch, the field and the entry, whichever slices the
// offsets straddle.
TEST(ReceivedMicrobatchTest, CheckRaggedRefusesForgedFields) {
  std::mt19937 rng(4);
  auto refused = [&](const std::function<void(v1::RaggedArray*)>& forge,
                     const std::vector<std::string>& parts) {
    v1::Microbatch m = RandomMicrobatch(rng, 30);
    forge(&(*m.mutable_ragged_token_fields())["sampling_mask"]);
    const std::string bytes = m.SerializeAsString();
    for (int trial = 0; trial < 20; ++trial) {
      absl::StatusOr<ReceivedMicrobatch> r =
          ReceivedMicrobatch::Parse(Buffer(bytes, RandomCuts(rng, bytes.size(), 1 + trial)));
      ASSERT_TRUE(r.ok()) << r.status();
      absl::StatusOr<RaggedShape> shape = r->CheckRagged("sampling_mask");
      ASSERT_FALSE(shape.ok()) << ::testing::PrintToString(parts);
      EXPECT_EQ(shape.status().code(), absl::StatusCode::kDataLoss);
      for (const std::string& part : parts) {
        EXPECT_THAT(std::string(shape.status().message()), ::testing::HasSubstr(part));
      }
      EXPECT_TRUE(r->CheckRagged("kept").ok());
    }
  };
  auto offsets = [](v1::RaggedArray* a, const std::function<void(std::vector<int64_t>*)>& f) {
    std::vector<int64_t> o(a->offsets().data().size() / 8);
    std::memcpy(o.data(), a->offsets().data().data(), a->offsets().data().size());
    f(&o);
    a->mutable_offsets()->set_data(
        std::string(reinterpret_cast<const char*>(o.data()), o.size() * 8));
  };
  const std::string field = "micro-batch 3: ragged_token_fields[\"sampling_mask\"]";
  refused([&](v1::RaggedArray* a) { offsets(a, [](auto* o) { (*o)[0] = -1; }); },
          {field, "offsets[0] is -1, not 0"});
  refused([&](v1::RaggedArray* a) { offsets(a, [](auto* o) { (*o)[7] = (*o)[6] - 1; }); },
          {field, "offsets[7] is", "below offsets[6]"});
  refused([&](v1::RaggedArray* a) { offsets(a, [](auto* o) { (*o)[30] -= 1; }); },
          {field, "offsets[30] is", "but values holds"});
  refused([&](v1::RaggedArray* a) { offsets(a, [](auto* o) { (*o)[12] = 1 << 20; }); },
          {field, "offsets[12] is 1048576, past the"});
  refused([&](v1::RaggedArray* a) { a->mutable_offsets()->mutable_data()->resize(30 * 8 + 3); },
          {field, "offsets holds 243 bytes, its 31 entries need 248"});
  refused([&](v1::RaggedArray* a) { a->mutable_values()->mutable_data()->push_back('x'); },
          {field, "values holds", "UINT16 need"});
  refused([&](v1::RaggedArray* a) { a->mutable_values()->set_dtype(v1::INT64); },
          {field, "values is INT64", "1-D UINT16 or INT32"});
  refused([&](v1::RaggedArray* a) { a->mutable_offsets()->set_dtype(v1::INT32); },
          {field, "offsets is INT32 [31]"});
  refused([&](v1::RaggedArray* a) { a->mutable_offsets()->clear_shape(); },
          {field, "offsets is INT64 []"});
  refused([&](v1::RaggedArray* a) { a->clear_values(); }, {field, "values is DTYPE_UNSPECIFIED"});
  v1::Microbatch m = RandomMicrobatch(rng, 3);
  absl::StatusOr<ReceivedMicrobatch> r =
      ReceivedMicrobatch::Parse(Buffer(m.SerializeAsString(), {}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->CheckRagged("absent").status().code(), absl::StatusCode::kNotFound);
}

// The per-sequence fields are parsed with the small fields, whole, and
// read back checked (sequence_metadata_test has the refusals).
TEST(ReceivedMicrobatchTest, PerSequenceFieldsAreHeldInMeta) {
  std::mt19937 rng(3);
  const v1::Microbatch m = RandomMicrobatch(rng, 40);
  const std::string bytes = m.SerializeAsString();
  absl::StatusOr<ReceivedMicrobatch> r =
      ReceivedMicrobatch::Parse(Buffer(bytes, RandomCuts(rng, bytes.size(), 7)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->meta().advantages().data(), m.advantages().data());
  EXPECT_EQ(r->meta().scalars().at("reward").data(), m.scalars().at("reward").data());
  EXPECT_EQ(r->data_size("advantages"), -1);  // not an array located in the slices
  absl::StatusOr<SequenceMetadata> seq = r->sequences();
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(seq->group_ids, (std::vector<std::string>{"q0", ""}));
  EXPECT_EQ(seq->policy_versions, (std::vector<int64_t>{3, -1}));
  EXPECT_EQ(seq->scalars.size(), 2u);
  EXPECT_TRUE(seq->has_advantages);
}

// Each field serialized on its own, in shuffled order, some twice, plus
// unknown fields and whole messages concatenated: protobuf merges them;
// ToMessage must give what ParseFromString gives.
TEST(ReceivedMicrobatchTest, NonCanonicalEncodingsParseAsProtobufParsesThem) {
  std::mt19937 rng(2);
  const google::protobuf::Descriptor* d = v1::Microbatch::descriptor();
  const google::protobuf::Reflection* reflection = v1::Microbatch::GetReflection();
  for (int trial = 0; trial < 300; ++trial) {
    const v1::Microbatch a = RandomMicrobatch(rng, 1 + static_cast<int>(rng() % 50));
    const v1::Microbatch b = RandomMicrobatch(rng, 1 + static_cast<int>(rng() % 50));
    std::vector<std::string> pieces;
    for (const v1::Microbatch* source : {&a, &b}) {
      for (int f = 0; f < d->field_count(); ++f) {
        if (rng() % 3 == 0) continue;  // not every field from every source
        v1::Microbatch one;
        const google::protobuf::FieldDescriptor* field = d->field(f);
        if (field->is_repeated()) {
          if (reflection->FieldSize(*source, field) == 0) continue;
        } else if (!reflection->HasField(*source, field)) {
          continue;
        }
        // Copy just this field.
        v1::Microbatch copy = *source;
        std::vector<const google::protobuf::FieldDescriptor*> all;
        reflection->ListFields(copy, &all);
        for (const auto* other : all) {
          if (other != field) reflection->ClearField(&copy, other);
        }
        one = copy;
        pieces.push_back(one.SerializeAsString());
      }
    }
    // An array without data, arrays' data replaced later, and an unknown field.
    v1::Microbatch shape_only;
    shape_only.mutable_replay_experts()->add_shape(4);
    pieces.push_back(shape_only.SerializeAsString());
    pieces.push_back(std::string("\xa8\x06\x05", 3));  // field 101, varint 5
    std::shuffle(pieces.begin(), pieces.end(), rng);
    std::string bytes;
    for (const std::string& p : pieces) bytes += p;

    v1::Microbatch expected;
    ASSERT_TRUE(expected.ParseFromString(bytes));
    absl::StatusOr<ReceivedMicrobatch> r =
        ReceivedMicrobatch::Parse(Buffer(bytes, RandomCuts(rng, bytes.size(), 8)));
    ASSERT_TRUE(r.ok()) << r.status();
    const v1::Microbatch got = r->ToMessage();
    ASSERT_TRUE(DeterministicBytes(got) == DeterministicBytes(expected)) << "trial " << trial;
    // Unknown fields are kept as protobuf keeps them.
    EXPECT_EQ(got.SerializeAsString().size(), expected.SerializeAsString().size());
    for (const char* name : kArrays) {
      const int64_t size = r->data_size(name);
      if (size >= 0) {
        std::string out(static_cast<size_t>(size), '\0');
        r->CopyData(name, out.data());
        const v1::Microbatch& e = expected;
        const std::string& want = std::string(name) == "tokens" ? e.tokens().data()
                                  : std::string(name) == "cu_seqlens" ? e.cu_seqlens().data()
                                  : std::string(name) == "cu_seqlens_padded"
                                      ? e.cu_seqlens_padded().data()
                                  : std::string(name) == "replay_experts" ? e.replay_experts().data()
                                                                          : e.replay_mask().data();
        EXPECT_EQ(out, want) << name;
      }
    }
  }
}

// Every prefix of a message, and random byte flips: refused exactly when
// protobuf refuses, and equal to protobuf's message when accepted.
TEST(ReceivedMicrobatchTest, RefusesExactlyWhatProtobufRefuses) {
  google::protobuf::LogSilencer quiet;  // protobuf logs each invalid UTF-8 string
  std::mt19937 rng(3);
  const std::string bytes = RandomMicrobatch(rng, 5).SerializeAsString();
  auto agree = [&](const std::string& input, const std::string& what) {
    v1::Microbatch expected;
    const bool protobuf_ok = expected.ParseFromString(input);
    absl::StatusOr<ReceivedMicrobatch> r =
        ReceivedMicrobatch::Parse(Buffer(input, RandomCuts(rng, input.size(), 3)));
    ASSERT_EQ(r.ok(), protobuf_ok) << what << ": " << r.status();
    if (r.ok()) {
      ASSERT_TRUE(DeterministicBytes(r->ToMessage()) == DeterministicBytes(expected)) << what;
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << what;
    }
  };
  for (size_t n = 0; n <= bytes.size(); ++n) agree(bytes.substr(0, n), "prefix");
  for (int trial = 0; trial < 20000; ++trial) {
    std::string flipped = bytes;
    const size_t at = rng() % flipped.size();
    flipped[at] ^= static_cast<char>(1 + rng() % 255);
    agree(flipped, absl::StrCat("byte ", at, " flipped to ", static_cast<uint8_t>(flipped[at])));
    // And three more bytes anywhere.
    for (int k = 0; k < 3; ++k) flipped[rng() % flipped.size()] = static_cast<char>(rng());
    agree(flipped, absl::StrCat("byte ", at, " and three more changed, trial ", trial));
  }
  // A malformed value in a token-field entry that a later entry of the same
  // key replaces: protobuf parses (and refuses) it all the same.
  {
    v1::Microbatch later;
    (*later.mutable_token_fields())["a"].add_shape(3);
    const std::string entry_key("\n\x01\x61", 3);                  // key "a"
    const std::string bad_value("\x12\x04\x12\x02\xff\xff", 6);   // shape: unterminated varint
    const std::string bad_entry = "R" + std::string(1, static_cast<char>(entry_key.size() +
                                                                      bad_value.size())) +
                                  entry_key + bad_value;               // field 10
    agree(bad_entry + later.SerializeAsString(), "malformed value replaced by a later entry");
  }
  // An invalid UTF-8 token-field name, as protobuf checks proto3 strings.
  v1::Microbatch bad_key;
  (*bad_key.mutable_token_fields())[std::string("\xff\xfe", 2)];
  agree(bad_key.SerializeAsString(), "utf-8 key");
  v1::Microbatch bad_ragged_key;
  (*bad_ragged_key.mutable_ragged_token_fields())[std::string("\xff\xfe", 2)];
  agree(bad_ragged_key.SerializeAsString(), "utf-8 ragged key");
  // A ragged entry without its arrays, one with unknown fields inside the
  // RaggedArray, and one whose values come in two merged occurrences.
  {
    const std::string key("\n\x01\x62", 3);                   // key "b"
    const std::string unknown("\x18\x07", 2);                 // field 3, varint 7
    const std::string values_a("\n\x04\x08\x04\x12\x00", 6);  // values {dtype 4, shape []}
    const std::string values_b("\n\x04\x1a\x02\x01\x02", 6);  // values {data "\x01\x02"}
    auto entry = [](const std::string& k, const std::string& ragged) {
      const std::string value = "\x12" + std::string(1, static_cast<char>(ragged.size())) + ragged;
      return "\xaa\x01" + std::string(1, static_cast<char>(k.size() + value.size())) + k + value;
    };
    agree(entry(key, ""), "empty ragged entry");
    agree(entry(key, unknown + values_a), "ragged with an unknown field");
    agree(entry(key, values_a + unknown + values_b), "ragged values merged");
    agree(entry(key, values_a) + entry(key, values_b), "ragged entry replaced");
  }
}

TEST(ReceivedMicrobatchTest, EmptyMessage) {
  absl::StatusOr<ReceivedMicrobatch> r = ReceivedMicrobatch::Parse(Buffer("", {}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ToMessage().ByteSizeLong() == 0);
  EXPECT_EQ(r->data_size("tokens"), -1);
}

}  // namespace
}  // namespace rollpack
