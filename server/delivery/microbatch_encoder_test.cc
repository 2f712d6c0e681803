// The fetch path's hand-made encoding must be exactly protobuf's canonical
// one: the trainer parses it with stock protobuf, and re-sent micro-batches
// must be byte-identical. Content is checked against the reference layout by
// server_test; this test checks the framing on every rank of varied steps.
#include "server/delivery/microbatch_encoder.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/sample_store.h"
#include "proto/wire/deterministic_bytes.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

ModelSpec Model(int num_experts, int first_dense) {
  ModelSpec m;
  m.name = "m";
  m.num_layers = 6;
  m.num_experts = num_experts;
  m.topk = 3;
  for (int l = first_dense; l < m.num_layers; ++l) m.moe_layers.push_back(l);
  return m;
}

// Samples with two token fields of different shapes (map order matters),
// some invalid rows, and ids distinct per row.
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
    out.push_back(std::move(s));
  }
  return out;
}

struct Case {
  int num_experts, first_dense, dp, cp, tp, pp;
};

class MicrobatchEncoderTest : public ::testing::TestWithParam<Case> {};

TEST_P(MicrobatchEncoderTest, EncodingIsCanonicalProtobufOnEveryRank) {
  const Case c = GetParam();
  const ModelSpec model = Model(c.num_experts, c.first_dense);
  SampleStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.RegisterModel("p", model).ok());
  ASSERT_TRUE(store.Put("p", Samples(model, 40, 7 + c.dp * 31 + c.pp)).ok());
  Topology topology;
  topology.dp = c.dp;
  topology.cp = c.cp;
  topology.tp = c.tp;
  topology.pp = c.pp;
  topology.max_tokens_per_rank = 1024;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep("st", "p", {}, 40, topology);
  ASSERT_TRUE(step.ok()) << step.status();
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
              ++checked;
            }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Topologies, MicrobatchEncoderTest,
                         ::testing::Values(Case{8, 0, 2, 1, 1, 1},     // every layer: whole rows
                                           Case{8, 2, 1, 2, 2, 2},     // dense layers, stage ranges
                                           Case{300, 1, 2, 2, 1, 3},   // uint16 ids
                                           Case{64, 0, 1, 1, 4, 2}));  // tp split router rows

TEST(MicrobatchEncoderErrorsTest, EncodeNeedsPrepareAndTheExactSize) {
  const ModelSpec model = Model(8, 0);
  SampleStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.RegisterModel("p", model).ok());
  ASSERT_TRUE(store.Put("p", Samples(model, 4, 1)).ok());
  Topology topology;
  topology.max_tokens_per_rank = 2048;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep("st", "p", {}, 4, topology);
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

}  // namespace
}  // namespace rollpack
