// The fetch path's hand-made encoding must be exactly protobuf's canonical
// one: the trainer parses it with stock protobuf, and re-sent micro-batches
// must be byte-identical. This test checks the framing on every rank of
// varied steps, and the content against the independent reference layout
// (testing/reference_layout.h), ragged token fields (layout.md section 13)
// included; pieces must assemble to the whole micro-batch, byte for byte.
#include "server/delivery/microbatch_encoder.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/convert.h"
#include "server/store/ndarray.h"
#include "server/store/sample_store.h"
#include "server/store/step_builder.h"
#include "proto/wire/deterministic_bytes.h"
#include "testing/reference_layout.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

ModelSpec Model(int num_experts, int first_dense, int vocab_size = 0) {
  ModelSpec m;
  m.name = "m";
  m.num_layers = 6;
  m.num_experts = num_experts;
  m.topk = 3;
  m.vocab_size = vocab_size;
  for (int l = first_dense; l < m.num_layers; ++l) m.moe_layers.push_back(l);
  return m;
}

// Ragged field `name` of `n` tokens in the model's stored id width: lists
// of 0 to 5 ids (a third empty; every list empty when `all_empty`).
StoredRagged RandomRagged(const ModelSpec& model, int64_t n, bool all_empty, std::mt19937& rng) {
  StoredRagged field;
  const int id_bytes = model.ragged_id_bytes();
  field.dtype = id_bytes == 2 ? v1::UINT16 : v1::INT32;
  const uint32_t ids = model.vocab_size > 0 ? static_cast<uint32_t>(model.vocab_size) : 1u << 20;
  field.offsets.push_back(0);
  for (int64_t t = 0; t < n; ++t) {
    const int count = all_empty || rng() % 3 == 0 ? 0 : 1 + static_cast<int>(rng() % 5);
    for (int j = 0; j < count; ++j) {
      const uint32_t id = rng() % ids;
      field.values.append(reinterpret_cast<const char*>(&id), id_bytes);  // little endian
    }
    field.offsets.push_back(field.offsets.back() + count);
  }
  return field;
}

// Samples with two token fields of different shapes (map order matters),
// two ragged ones (every list of "allowed" empty on every fifth sample),
// some invalid rows, and ids distinct per row; in groups of 4 (ids "g<k>"),
// with versions, a reward, another scalar every sample has and one only
// some have (lifecycle.md section 6).
std::vector<StoredSample> Samples(const ModelSpec& model, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  const int moe_layers = static_cast<int>(model.ResolvedMoeLayers().size());
  const int id_bytes = model.stored_id_bytes();
  std::vector<StoredSample> out;
  for (int i = 0; i < count; ++i) {
    const int64_t n = 1 + rng() % 300;
    StoredSample s;
    s.sample_id = "s" + std::to_string(i);
    for (int64_t t = 0; t < n; ++t) s.tokens.push_back(static_cast<int32_t>(rng()));
    s.experts.resize(n * moe_layers * model.topk * id_bytes);
    for (int64_t r = 0; r < n * moe_layers; ++r) {
      for (int j = 0; j < model.topk; ++j) {
        const int id = (static_cast<int>(r) + j) % model.num_experts;
        std::memcpy(&s.experts[(r * model.topk + j) * id_bytes], &id, id_bytes);
      }
    }
    s.row_valid.assign(n, 1);
    s.row_valid[rng() % n] = 0;
    StoredField logprobs;
    logprobs.dtype = v1::FLOAT32;
    for (int64_t t = 0; t < n * 4; ++t) logprobs.data.push_back(static_cast<char>(rng()));
    s.token_fields["logprobs"] = logprobs;
    StoredField advantages;
    advantages.dtype = v1::BFLOAT16;
    advantages.trailing_shape = {2};
    for (int64_t t = 0; t < n * 4; ++t) advantages.data.push_back(static_cast<char>(rng()));
    s.token_fields["advantages"] = advantages;
    s.ragged_fields["sampling_mask"] = RandomRagged(model, n, false, rng);
    s.ragged_fields["allowed"] = RandomRagged(model, n, i % 5 == 0, rng);
    s.group_id = "g" + std::to_string(i / 4);
    s.group_size = 4;
    s.policy_version = i % 5;
    s.scalars["reward"] = static_cast<double>(rng() % 7) / 3;
    s.scalars["b_len"] = static_cast<double>(n);
    if (i % 3 == 0) s.scalars["some"] = 1;
    out.push_back(std::move(s));
  }
  return out;
}

// The sample as a producer sends it, for the reference layout: routing as
// [n, |M|, K] int32 with -1 rows for invalid ones, ragged fields in one of
// the input forms section 13 accepts (`form` % 3: int64 values with int32
// offsets, int32 values with int64 offsets, uint16 values where the ids
// fit), which the reference reads and narrows on its own.
v1::Sample SentSample(const ModelSpec& model, const StoredSample& stored, int form) {
  v1::Sample sent;
  sent.set_sample_id(stored.sample_id);
  const int64_t n = stored.num_tokens();
  sent.mutable_tokens()->set_dtype(v1::INT32);
  sent.mutable_tokens()->add_shape(n);
  sent.mutable_tokens()->set_data(stored.tokens.data(), 4 * n);
  for (const auto& [name, field] : stored.token_fields) {
    v1::NDArray& array = (*sent.mutable_token_fields())[name];
    array.set_dtype(field.dtype);
    array.add_shape(n);
    for (int64_t d : field.trailing_shape) array.add_shape(d);
    array.set_data(field.data);
  }
  if (!model.is_dense()) {
    const int layers = static_cast<int>(model.ResolvedMoeLayers().size());
    const int id_bytes = model.stored_id_bytes();
    v1::NDArray& routed = *sent.mutable_routed_experts();
    routed.set_dtype(v1::INT32);
    routed.add_shape(n);
    routed.add_shape(layers);
    routed.add_shape(model.topk);
    for (int64_t i = 0; i < n * layers * model.topk; ++i) {
      int32_t id = 0;
      std::memcpy(&id, &stored.experts[i * id_bytes], id_bytes);
      if (!stored.row_valid[i / (layers * model.topk)]) id = -1;
      routed.mutable_data()->append(reinterpret_cast<const char*>(&id), 4);
    }
  }
  for (const auto& [name, field] : stored.ragged_fields) {
    v1::RaggedArray& ragged = (*sent.mutable_ragged_token_fields())[name];
    const int id_bytes = DTypeSize(field.dtype);
    const int64_t count = field.offsets.back();
    const v1::DType values_dtype = form % 3 == 0   ? v1::INT64
                                   : form % 3 == 1 ? v1::INT32
                                                   : v1::DType(field.dtype);  // uint16 or int32
    const int offsets_bytes = form % 3 == 1 ? 8 : 4;
    ragged.mutable_values()->set_dtype(values_dtype);
    ragged.mutable_values()->add_shape(count);
    for (int64_t i = 0; i < count; ++i) {
      uint32_t id = 0;
      std::memcpy(&id, field.values.data() + i * id_bytes, id_bytes);
      const int64_t wide = id;  // little endian: its low bytes are the narrower forms
      ragged.mutable_values()->mutable_data()->append(reinterpret_cast<const char*>(&wide),
                                                      DTypeSize(values_dtype));
    }
    ragged.mutable_offsets()->set_dtype(offsets_bytes == 8 ? v1::INT64 : v1::INT32);
    ragged.mutable_offsets()->add_shape(n + 1);
    for (int64_t offset : field.offsets) {
      ragged.mutable_offsets()->mutable_data()->append(reinterpret_cast<const char*>(&offset),
                                                       offsets_bytes);
    }
  }
  return sent;
}

struct Case {
  int num_experts, first_dense, dp, cp, tp, pp;
  int vocab_size = 0;  // layout.md section 13: uint16 ragged ids when in [1, 65536]
  bool dynamic_cp = false;
  int pad_multiple = 1;
};

// Test names from the values (gtest would print the bytes, padding
// included, which differ between builds).
void PrintTo(const Case& c, std::ostream* os) {
  *os << "E" << c.num_experts << "_dense" << c.first_dense << "_dp" << c.dp << "_cp" << c.cp
      << "_tp" << c.tp << "_pp" << c.pp << "_V" << c.vocab_size
      << (c.dynamic_cp ? "_dynamic" : "") << "_pad" << c.pad_multiple;
}

class MicrobatchEncoderTest : public ::testing::TestWithParam<Case> {
 protected:
  // The step's samples as sent, by id (CaseStep fills it).
  std::vector<v1::Sample> sent_;
  std::map<std::string, const v1::Sample*> sent_by_id_;

  // A step over 40 samples (seeded) in `store` with the case's topology.
  absl::StatusOr<std::shared_ptr<const Step>> CaseStep(const Case& c, uint32_t seed,
                                                      SampleStore* store);
};

absl::StatusOr<std::shared_ptr<const Step>> MicrobatchEncoderTest::CaseStep(
    const Case& c, uint32_t seed, SampleStore* store) {
  const ModelSpec model = Model(c.num_experts, c.first_dense, c.vocab_size);
  if (absl::Status s = store->RegisterModel("p", model).status(); !s.ok()) return s;
  std::vector<StoredSample> samples = Samples(model, 40, seed + c.dp * 31 + c.pp);
  sent_.clear();
  sent_by_id_.clear();
  for (const StoredSample& sample : samples) {
    sent_.push_back(SentSample(model, sample, static_cast<int>(sent_.size())));
  }
  for (const v1::Sample& sample : sent_) sent_by_id_[sample.sample_id()] = &sample;
  if (absl::Status s = store->Put("p", std::move(samples)).status(); !s.ok()) return s;
  Topology topology;
  topology.dp = c.dp;
  topology.cp = c.cp;
  topology.tp = c.tp;
  topology.pp = c.pp;
  topology.pad_multiple = c.pad_multiple;
  if (c.dynamic_cp) topology.scheduler = SchedulerKind::kDynamicCp;
  topology.max_tokens_per_rank = 1024;
  StepRequest request;
  request.step_id = "st";
  request.pool = "p";
  request.selection.num_samples = 40;
  request.topology = topology;
  request.advantage.estimator = AdvantageEstimator::kGrpo;
  return store->CreateStep(request);
}

// The micro-batch's sequences' metadata, as the step has it (layout.md
// section 12): `parsed` must say exactly this.
void ExpectSequenceMetadata(const Step& step, const v1::Microbatch& parsed) {
  const int n = parsed.sample_ids_size();
  ASSERT_EQ(parsed.group_ids_size(), n);
  ASSERT_EQ(parsed.policy_versions_size(), n);
  ASSERT_EQ(parsed.scalars_size(), 2);  // "some" is not on every sample
  const v1::NDArray& reward = parsed.scalars().at("reward");
  const v1::NDArray& len = parsed.scalars().at("b_len");
  const v1::NDArray& adv = parsed.advantages();
  for (const v1::NDArray* a : {&reward, &len}) {
    EXPECT_EQ(a->dtype(), v1::FLOAT64);
    ASSERT_EQ(a->shape_size(), 1);
    EXPECT_EQ(a->shape(0), n);
    ASSERT_EQ(a->data().size(), 8u * n);
  }
  EXPECT_EQ(adv.dtype(), v1::FLOAT32);
  ASSERT_EQ(adv.shape_size(), 1);
  EXPECT_EQ(adv.shape(0), n);
  ASSERT_EQ(adv.data().size(), 4u * n);
  for (int j = 0; j < n; ++j) {
    const auto at = std::find(step.sample_ids.begin(), step.sample_ids.end(), parsed.sample_ids(j));
    ASSERT_NE(at, step.sample_ids.end());
    const size_t seq = static_cast<size_t>(at - step.sample_ids.begin());
    const StoredSample& sample = *step.samples[seq];
    EXPECT_EQ(parsed.group_ids(j), sample.group_id);
    EXPECT_EQ(parsed.policy_versions(j), sample.policy_version);
    double r, l;
    float a;
    std::memcpy(&r, reward.data().data() + 8 * j, 8);  // little endian, as the host
    std::memcpy(&l, len.data().data() + 8 * j, 8);
    std::memcpy(&a, adv.data().data() + 4 * j, 4);
    EXPECT_EQ(r, sample.scalars.at("reward"));
    EXPECT_EQ(l, sample.scalars.at("b_len"));
    EXPECT_EQ(std::memcmp(&a, &step.metadata.advantages[seq], 4), 0);
  }
}

TEST_P(MicrobatchEncoderTest, EncodingIsCanonicalProtobufOnEveryRank) {
  const Case c = GetParam();
  SampleStore store(int64_t{1} << 30);
  absl::StatusOr<std::shared_ptr<const Step>> step = CaseStep(c, 7, &store);
  ASSERT_TRUE(step.ok()) << step.status();
  const v1::Plan plan = PlanToProto(**step);
  const v1::ModelSpec model = ToProto((*step)->model);
  int checked = 0;
  MicrobatchEncoder encoder;  // reused across micro-batches, as a stream does
  for (bool all_fields : {false, true}) {
    for (int d = 0; d < c.dp; ++d)
      for (int cp = 0; cp < c.cp; ++cp)
        for (int t = 0; t < c.tp; ++t)
          for (int p = 0; p < c.pp; ++p)
            for (int m = 0; m < (*step)->layout.num_microbatches(); ++m) {
              ASSERT_TRUE(encoder.Prepare(**step, {{d, cp, t, p}, m, all_fields}).ok());
              std::string bytes(encoder.encoded_size(), '\xee');
              ASSERT_TRUE(encoder.Encode(absl::MakeSpan(bytes)).ok());
              v1::Microbatch parsed;
              ASSERT_TRUE(parsed.ParseFromString(bytes)) << "rank " << d << cp << t << p;
              ASSERT_EQ(DeterministicBytes(parsed), bytes)
                  << "rank dp" << d << " cp" << cp << " tp" << t << " pp" << p << " mb " << m;
              EXPECT_EQ(parsed.index(), m);
              EXPECT_EQ(parsed.has_tokens(), p == 0 || all_fields);
              EXPECT_EQ(parsed.token_fields_size(), (p == c.pp - 1 || all_fields) ? 2 : 0);
              EXPECT_EQ(parsed.ragged_token_fields_size(),
                        (p == c.pp - 1 || all_fields) ? 2 : 0);
              ExpectSequenceMetadata(**step, parsed);
              v1::RankCoords coords;
              coords.set_dp(d);
              coords.set_cp(cp);
              coords.set_tp(t);
              coords.set_pp(p);
              absl::StatusOr<ExpectedMicrobatch> want =
                  ReferenceMicrobatch(plan, model, sent_by_id_, coords, m);
              ASSERT_TRUE(want.ok()) << want.status();
              ASSERT_EQ(want->ragged_fields.size(), 2u);
              absl::Status same =
                  CheckMicrobatch(parsed, *want, plan.topology(), coords, model, all_fields);
              ASSERT_TRUE(same.ok()) << same;
              ++checked;
            }
  }
  EXPECT_GT(checked, 0);
}

// Scatters `piece`'s rows of `array` into `full` (row_bytes each), marking
// each row in `covered`; false on an overlap or a size that does not match.
// Each row's list of a ragged field, filled piece by piece (layout.md
// section 13: a piece's lists are its rows', in order, offsets from 0).
struct RaggedRows {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::map<int64_t, std::string> lists;  // row -> its values' bytes
};

// Adds `piece`'s lists for the rows `spans` lists; false when its offsets
// do not start at 0, cover another number of rows, or a row repeats.
bool ScatterRagged(const v1::RaggedArray& piece,
                   const google::protobuf::RepeatedField<int64_t>& spans, RaggedRows* rows) {
  const v1::NDArray& offsets = piece.offsets();
  const int item = DTypeSize(piece.values().dtype());
  if (offsets.dtype() != v1::INT64 || offsets.shape_size() != 1 || item == 0) return false;
  std::vector<int64_t> bounds(offsets.data().size() / 8);
  std::memcpy(bounds.data(), offsets.data().data(), offsets.data().size());
  int64_t listed = 0;
  for (int i = 1; i < spans.size(); i += 2) listed += spans[i];
  if (static_cast<int64_t>(bounds.size()) != listed + 1 || offsets.shape(0) != listed + 1 ||
      bounds[0] != 0 || piece.values().shape(0) * item !=
                            static_cast<int64_t>(piece.values().data().size()) ||
      bounds.back() != piece.values().shape(0)) {
    return false;
  }
  if (rows->dtype == v1::DTYPE_UNSPECIFIED) rows->dtype = piece.values().dtype();
  if (rows->dtype != piece.values().dtype()) return false;
  int64_t k = 0;
  for (int i = 0; i + 1 < spans.size(); i += 2) {
    for (int64_t r = spans[i]; r < spans[i] + spans[i + 1]; ++r, ++k) {
      const std::string list =
          piece.values().data().substr(bounds[k] * item, (bounds[k + 1] - bounds[k]) * item);
      if (!rows->lists.emplace(r, list).second) return false;
    }
  }
  return true;
}

// The micro-batch's field from every row's list; false unless rows
// [0, num_rows) are all there.
bool AssembleRagged(const RaggedRows& rows, int64_t num_rows, v1::RaggedArray* out) {
  if (static_cast<int64_t>(rows.lists.size()) != num_rows ||
      (num_rows > 0 && rows.lists.rbegin()->first != num_rows - 1)) {
    return false;
  }
  std::string values;
  std::vector<int64_t> offsets = {0};
  const int item = DTypeSize(rows.dtype);
  for (const auto& [row, list] : rows.lists) {
    values += list;
    offsets.push_back(static_cast<int64_t>(values.size()) / item);
  }
  out->mutable_values()->set_dtype(rows.dtype);
  out->mutable_values()->add_shape(offsets.back());
  out->mutable_values()->set_data(values);
  out->mutable_offsets()->set_dtype(v1::INT64);
  out->mutable_offsets()->add_shape(num_rows + 1);
  out->mutable_offsets()->set_data(reinterpret_cast<const char*>(offsets.data()),
                                   offsets.size() * 8);
  return true;
}

bool Scatter(const v1::NDArray& array, const google::protobuf::RepeatedField<int64_t>& spans,
             v1::NDArray* full, std::vector<int>* covered) {
  const int64_t rows = array.shape(0);
  int64_t total = DTypeSize(array.dtype());
  for (int64_t d : array.shape()) total *= d;
  if (full->shape_size() == 0) {  // the first piece with this array
    *full = array;
    full->mutable_data()->assign(static_cast<size_t>(total), '\0');
    covered->assign(rows, 0);
  } else if (full->dtype() != array.dtype() || full->shape().size() != array.shape().size() ||
             !std::equal(full->shape().begin(), full->shape().end(), array.shape().begin())) {
    return false;
  }
  const size_t row_bytes = rows == 0 ? 0 : static_cast<size_t>(total / rows);
  size_t offset = 0;
  for (int i = 0; i + 1 < spans.size(); i += 2) {
    for (int64_t r = spans[i]; r < spans[i] + spans[i + 1]; ++r) {
      if (r < 0 || r >= rows || (*covered)[r]++ != 0) return false;
    }
    const size_t n = static_cast<size_t>(spans[i + 1]) * row_bytes;
    if (offset + n > array.data().size()) return false;
    full->mutable_data()->replace(static_cast<size_t>(spans[i]) * row_bytes, n, array.data(),
                                  offset, n);
    offset += n;
  }
  return offset == array.data().size();
}

TEST_P(MicrobatchEncoderTest, PiecesOfEveryOwnerTileTheMicrobatch) {
  const Case c = GetParam();
  SampleStore store(int64_t{1} << 30);
  absl::StatusOr<std::shared_ptr<const Step>> step = CaseStep(c, 11, &store);
  ASSERT_TRUE(step.ok()) << step.status();
  // Three owners; member 3 owns nothing (a rank may dial a member without
  // samples of its micro-batch).
  const std::vector<std::string> members = {"m0:1", "m1:1", "m2:1", "m3:1"};
  std::mt19937 rng(5);
  std::vector<int32_t> owner((*step)->sample_ids.size());
  for (int32_t& o : owner) o = static_cast<int32_t>(rng() % 3);
  MicrobatchEncoder whole_encoder;
  MicrobatchEncoder encoder;
  int pieces_seen = 0;
  for (int header_member : {0, 3}) {
    for (int d = 0; d < c.dp; ++d)
      for (int cp = 0; cp < c.cp; ++cp)
        for (int t = 0; t < c.tp; ++t)
          for (int p = 0; p < c.pp; ++p)
            for (int m = 0; m < (*step)->layout.num_microbatches(); ++m) {
              SCOPED_TRACE(::testing::Message() << "rank dp" << d << " cp" << cp << " tp" << t
                                                << " pp" << p << " mb " << m << " header m"
                                                << header_member);
              const RankCoords rank{d, cp, t, p};
              ASSERT_TRUE(whole_encoder.Prepare(**step, {rank, m, false}).ok());
              std::string whole(whole_encoder.encoded_size(), '\0');
              ASSERT_TRUE(whole_encoder.Encode(absl::MakeSpan(whole)).ok());

              auto encode_piece = [&](int self, bool header, v1::Microbatch* out) -> bool {
                PieceSelection selection{owner, members, self, header};
                EXPECT_TRUE(encoder.Prepare(**step, {rank, m, false, &selection}).ok());
                if (encoder.empty_piece()) return false;
                std::string bytes(encoder.encoded_size(), '\0');
                EXPECT_TRUE(encoder.Encode(absl::MakeSpan(bytes)).ok());
                EXPECT_TRUE(out->ParseFromString(bytes));
                EXPECT_EQ(DeterministicBytes(*out), bytes);
                EXPECT_EQ(out->piece().member(), members[self]);
                EXPECT_EQ(out->piece().header(), header);
                return true;
              };
              v1::Microbatch header;
              ASSERT_TRUE(encode_piece(header_member, true, &header));
              std::vector<v1::Microbatch> pieces = {header};
              std::vector<std::string> expected_members;
              for (int o = 0; o < 4; ++o) {
                v1::Microbatch piece;
                const bool has_rows = encode_piece(o, false, &piece);
                if (has_rows) {
                  // Ragged fields travel with the token fields.
                  EXPECT_EQ(piece.ragged_token_fields_size(), piece.token_fields_size());
                  // The per-sequence metadata travels in the header piece alone.
                  EXPECT_EQ(piece.group_ids_size(), 0);
                  EXPECT_EQ(piece.policy_versions_size(), 0);
                  EXPECT_EQ(piece.scalars_size(), 0);
                  EXPECT_FALSE(piece.has_advantages());
                }
                if (o == header_member) continue;
                if (has_rows) {
                  expected_members.push_back(members[o]);
                  pieces.push_back(piece);
                  ++pieces_seen;
                }
              }
              EXPECT_EQ(std::vector<std::string>(header.piece().members().begin(),
                                                 header.piece().members().end()),
                        expected_members);
              // Assembled: the header's fields, every array scattered.
              v1::Microbatch assembled = header;
              assembled.clear_piece();
              assembled.clear_tokens();
              assembled.clear_replay_experts();
              assembled.clear_replay_mask();
              assembled.clear_token_fields();
              assembled.clear_ragged_token_fields();
              std::map<std::string, std::vector<int>> covered;
              std::map<std::string, RaggedRows> ragged;
              for (const v1::Microbatch& piece : pieces) {
                const auto& tr = piece.piece().token_rows();
                const auto& rr = piece.piece().router_rows();
                if (piece.has_tokens()) {
                  ASSERT_TRUE(Scatter(piece.tokens(), tr, assembled.mutable_tokens(),
                                      &covered["tokens"]));
                }
                for (const auto& [name, array] : piece.token_fields()) {
                  ASSERT_TRUE(Scatter(array, tr, &(*assembled.mutable_token_fields())[name],
                                      &covered[name]));
                }
                for (const auto& [name, field] : piece.ragged_token_fields()) {
                  ASSERT_TRUE(ScatterRagged(field, tr, &ragged[name])) << name;
                }
                if (piece.has_replay_experts()) {
                  ASSERT_TRUE(Scatter(piece.replay_experts(), rr,
                                      assembled.mutable_replay_experts(), &covered["experts"]));
                  ASSERT_TRUE(Scatter(piece.replay_mask(), rr, assembled.mutable_replay_mask(),
                                      &covered["mask"]));
                }
              }
              for (const auto& [name, rows] : covered) {
                EXPECT_EQ(std::count(rows.begin(), rows.end(), 1),
                          static_cast<int64_t>(rows.size()))
                    << name;
              }
              if (p == c.pp - 1) {
                ASSERT_EQ(ragged.size(), 2u);
                const int64_t rows = assembled.token_fields().at("logprobs").shape(0);
                for (const auto& [name, rows_of] : ragged) {
                  ASSERT_TRUE(AssembleRagged(rows_of, rows,
                                             &(*assembled.mutable_ragged_token_fields())[name]))
                      << name;
                }
              }
              ExpectSequenceMetadata(**step, header);
              ASSERT_EQ(DeterministicBytes(assembled), whole);
            }
  }
  EXPECT_GT(pieces_seen, 0);
}

INSTANTIATE_TEST_SUITE_P(Topologies, MicrobatchEncoderTest,
                         ::testing::Values(Case{8, 0, 2, 1, 1, 1},     // every layer: whole rows
                                           Case{8, 2, 1, 2, 2, 2},     // dense layers, stage ranges
                                           Case{300, 1, 2, 2, 1, 3},   // uint16 ids
                                           Case{64, 0, 1, 1, 4, 2},    // tp split router rows
                                           // uint16 ragged ids, zigzag CP 4, padding
                                           Case{8, 0, 1, 4, 1, 2, 50000, false, 8},
                                           // int32 ragged ids (V > 65536), dynamic CP
                                           Case{8, 1, 2, 2, 1, 1, 151936, true, 1}));

// A step "st" over 4 samples of Model(8, 0) on one rank.
absl::StatusOr<std::shared_ptr<const Step>> FourSampleStep(SampleStore* store,
                                                           Topology* topology) {
  const ModelSpec model = Model(8, 0);
  if (absl::Status s = store->RegisterModel("p", model).status(); !s.ok()) return s;
  if (absl::Status s = store->Put("p", Samples(model, 4, 1)).status(); !s.ok()) return s;
  topology->max_tokens_per_rank = 2048;
  return store->CreateStep("st", "p", {}, 4, *topology);
}

TEST(MicrobatchEncoderErrorsTest, EncodeNeedsPrepareAndTheExactSize) {
  SampleStore store(int64_t{1} << 30);
  Topology topology;
  absl::StatusOr<std::shared_ptr<const Step>> step = FourSampleStep(&store, &topology);
  ASSERT_TRUE(step.ok()) << step.status();

  MicrobatchEncoder encoder;
  std::string bytes(16, '\0');
  EXPECT_EQ(encoder.Encode(absl::MakeSpan(bytes)).code(), absl::StatusCode::kFailedPrecondition);
  absl::Status bad_rank = encoder.Prepare(**step, {{1, 0, 0, 0}, 0, false});
  EXPECT_EQ(bad_rank.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(encoder.Encode(absl::MakeSpan(bytes)).code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(encoder.Prepare(**step, {{0, 0, 0, 0}, 0, false}).ok());
  bytes.assign(encoder.encoded_size() - 1, '\0');
  absl::Status short_buffer = encoder.Encode(absl::MakeSpan(bytes));
  EXPECT_EQ(short_buffer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_buffer.message(), HasSubstr("the encoding needs"));
}

// A step whose record says more tokens than a sample holds (a forged cluster
// record) is refused before a byte is gathered: the runs would read past the
// sample.
TEST(MicrobatchEncoderErrorsTest, ASampleShorterThanItsRecordIsNeverEncoded) {
  SampleStore store(int64_t{1} << 30);
  Topology topology;
  absl::StatusOr<std::shared_ptr<const Step>> step = FourSampleStep(&store, &topology);
  ASSERT_TRUE(step.ok()) << step.status();
  const ModelSpec model = (*step)->model;

  // The cluster path: a plan from a record's ids and lengths, the samples the
  // owner holds.
  std::vector<int64_t> lengths((*step)->layout.lengths().begin(),
                               (*step)->layout.lengths().end());
  const int64_t real = lengths[2];
  lengths[2] = real + 100;
  absl::StatusOr<std::shared_ptr<const Step>> forged = BuildStepFromMetadata(
      "forged", "p", model, topology, (*step)->sample_ids, lengths);
  ASSERT_TRUE(forged.ok()) << forged.status();

  MicrobatchEncoder encoder;
  bool refused = false;
  for (int index = 0; index < (*forged)->layout.num_microbatches(); ++index) {
    absl::Status status = encoder.Prepare(**forged, {{0, 0, 0, 0}, index, false},
                                          (*step)->samples);
    if (status.ok()) continue;
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_THAT(status.message(), HasSubstr("step \"forged\""));
    EXPECT_THAT(status.message(), HasSubstr("sample \"" + (*step)->sample_ids[2] + "\""));
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("holds ", real, " tokens")));
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("says ", real + 100)));
    refused = true;
  }
  EXPECT_TRUE(refused) << "no micro-batch of the forged step was refused";
}

// A record whose model gathers wider routing rows than the samples hold (a
// forged topk or layer count) is refused before a byte is gathered.
TEST(MicrobatchEncoderErrorsTest, RoutingNarrowerThanTheRecordsModelIsNeverGathered) {
  SampleStore store(int64_t{1} << 30);
  Topology topology;
  absl::StatusOr<std::shared_ptr<const Step>> step = FourSampleStep(&store, &topology);
  ASSERT_TRUE(step.ok()) << step.status();
  ModelSpec wider = (*step)->model;
  wider.topk += 1;
  std::vector<int64_t> lengths((*step)->layout.lengths().begin(),
                               (*step)->layout.lengths().end());
  absl::StatusOr<std::shared_ptr<const Step>> forged =
      BuildStepFromMetadata("forged", "p", wider, topology, (*step)->sample_ids, lengths);
  ASSERT_TRUE(forged.ok()) << forged.status();
  MicrobatchEncoder encoder;
  absl::Status status = encoder.Prepare(**forged, {{0, 0, 0, 0}, 0, false}, (*step)->samples);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("bytes of routing, the step's model needs"));
}

// Every list empty (prompt tokens only): values is an empty array, whose
// data protobuf leaves out, and offsets are all 0.
TEST(MicrobatchEncoderRaggedTest, EmptyListsEncodeAsProtobufDoes) {
  SampleStore store(int64_t{1} << 30);
  const ModelSpec model = Model(8, 0, 32000);
  ASSERT_TRUE(store.RegisterModel("p", model).ok());
  std::vector<StoredSample> samples = Samples(model, 4, 3);
  std::mt19937 rng(1);
  for (StoredSample& s : samples) {
    for (auto& [name, field] : s.ragged_fields) {
      field = RandomRagged(model, s.num_tokens(), true, rng);
    }
  }
  ASSERT_TRUE(store.Put("p", std::move(samples)).ok());
  Topology topology;
  topology.max_tokens_per_rank = 2048;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep("st", "p", {}, 4, topology);
  ASSERT_TRUE(step.ok()) << step.status();
  MicrobatchEncoder encoder;
  ASSERT_TRUE(encoder.Prepare(**step, {{0, 0, 0, 0}, 0, false}).ok());
  std::string bytes(encoder.encoded_size(), '\0');
  ASSERT_TRUE(encoder.Encode(absl::MakeSpan(bytes)).ok());
  v1::Microbatch parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(DeterministicBytes(parsed), bytes);
  ASSERT_EQ(parsed.ragged_token_fields_size(), 2);
  for (const auto& [name, field] : parsed.ragged_token_fields()) {
    EXPECT_EQ(field.values().dtype(), v1::UINT16) << name;
    ASSERT_EQ(field.values().shape_size(), 1) << name;
    EXPECT_EQ(field.values().shape(0), 0) << name;
    EXPECT_TRUE(field.values().data().empty()) << name;
    EXPECT_EQ(field.offsets().data(), std::string(8 * (parsed.tokens().shape(0) + 1), '\0'))
        << name;
  }
}

// Samples given apart from the step (a cluster step) whose ragged fields do
// not fit their tokens or the micro-batch's other samples are refused
// before a byte is gathered.
TEST(MicrobatchEncoderRaggedTest, RaggedFieldsThatDoNotFitAreNeverGathered) {
  SampleStore store(int64_t{1} << 30);
  Topology topology;
  absl::StatusOr<std::shared_ptr<const Step>> step = FourSampleStep(&store, &topology);
  ASSERT_TRUE(step.ok()) << step.status();
  const std::string victim = (*step)->sample_ids[1];
  auto refused = [&](const std::function<void(StoredSample*)>& damage) {
    std::vector<std::shared_ptr<const StoredSample>> samples = (*step)->samples;
    auto copy = std::make_shared<StoredSample>(*samples[1]);
    damage(copy.get());
    samples[1] = copy;
    MicrobatchEncoder encoder;
    return encoder.Prepare(**step, {{0, 0, 0, 0}, 0, false}, samples);
  };
  absl::Status status =
      refused([](StoredSample* s) { s->ragged_fields["allowed"].offsets.pop_back(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("sample \"" + victim + "\" holds ragged_token_fields[\"allowed\"] of"));
  status =
      refused([](StoredSample* s) { s->ragged_fields["sampling_mask"].values.push_back('x'); });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("ragged_token_fields[\"sampling_mask\"]"));
  status = refused([](StoredSample* s) { s->ragged_fields.erase("allowed"); });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("ragged token fields, the micro-batch's other samples"));
  status = refused([](StoredSample* s) { s->ragged_fields["allowed"].dtype = v1::UINT16; });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("ragged_token_fields[\"allowed\"] as "));
}

}  // namespace
}  // namespace rollpack
