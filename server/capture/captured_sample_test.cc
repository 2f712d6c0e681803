#include "server/capture/captured_sample.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/capture/capture_test_support.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelSpec Model() { return MoeModel(3, 16, 2); }

// A .npy file (format 1.0) of uint8 ids shaped [rows, layers, k].
std::string Npy(int64_t rows, int layers, int k, uint8_t first) {
  std::string dict = absl::StrCat("{'descr': '|u1', 'fortran_order': False, 'shape': (", rows,
                                  ", ", layers, ", ", k, "), }");
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string file = "\x93NUMPY\x01";
  file += '\0';
  file += static_cast<char>(dict.size() & 0xff);
  file += static_cast<char>(dict.size() >> 8);
  file += dict;
  for (int64_t i = 0; i < rows * layers * k; ++i) {
    file += static_cast<char>((first + i) % 16);
  }
  return file;
}

CapturedIdentity Identity(const std::string& sample_id) {
  CapturedIdentity identity;
  identity.sample_id = sample_id;
  return identity;
}

template <typename T>
std::vector<T> Values(const v1::NDArray& array) {
  std::vector<T> out(array.data().size() / sizeof(T));
  std::memcpy(out.data(), array.data().data(), array.data().size());
  return out;
}

struct Choice {
  std::string routing;  // base64, owned here: EngineChoice holds a view
  EngineChoice choice;
};

Choice VllmChoice(int64_t rows) {
  Choice c;
  c.routing = absl::Base64Escape(Npy(rows, 3, 2, 0));
  c.choice.prompt_ids = {11, 12, 13};
  c.choice.generated_ids = {21, 22};
  c.choice.logprobs = {-0.5f, -1.25f};
  c.choice.routing_base64 = c.routing;
  return c;
}

TEST(CapturedSampleTest, AVllmChoiceIsTheSampleAProducerWouldPut) {
  Choice c = VllmChoice(4);  // 5 tokens: rows for [0, 4)
  CapturedIdentity identity;
  identity.sample_id = "cmpl-1#0";
  identity.group_id = "cmpl-1";
  identity.group_size = 2;
  identity.policy_version = 7;
  identity.scalars = {{"reward", 1.0}};
  absl::StatusOr<v1::Sample> s = CapturedSample(Engine::kVllm, c.choice, Model(), 0, identity);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->sample_id(), "cmpl-1#0");
  EXPECT_EQ(s->group_id(), "cmpl-1");
  EXPECT_EQ(s->group_size(), 2);
  EXPECT_EQ(s->policy_version(), 7);
  EXPECT_EQ(s->scalars().at("reward"), 1.0);
  EXPECT_FALSE(s->partial());
  EXPECT_THAT(Values<int32_t>(s->tokens()), ElementsAre(11, 12, 13, 21, 22));
  EXPECT_THAT(Values<uint8_t>(s->token_fields().at("loss_mask")), ElementsAre(0, 0, 0, 1, 1));
  EXPECT_THAT(Values<float>(s->token_fields().at("logprobs")),
              ElementsAre(0.0f, 0.0f, 0.0f, -0.5f, -1.25f));
  EXPECT_EQ(s->routed_experts().dtype(), v1::UINT8);
  EXPECT_THAT(s->routed_experts().shape(), ElementsAre(4, 3, 2));
  EXPECT_EQ(s->routed_experts_row_offset(), 0);
  EXPECT_EQ(Values<uint8_t>(s->routed_experts())[5], 5);
}

TEST(CapturedSampleTest, WithoutLogprobsThereIsNoLogprobField) {
  Choice c = VllmChoice(4);
  c.choice.logprobs.clear();
  absl::StatusOr<v1::Sample> s = CapturedSample(Engine::kVllm, c.choice, Model(), 0, Identity("s"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->token_fields().count("logprobs"), 0);
  EXPECT_EQ(s->token_fields().count("loss_mask"), 1);
}

TEST(CapturedSampleTest, ASessionPieceHoldsOnlyTheNewTokensAndRows) {
  // Turn 2 of a session whose stored piece has tokens [0, 3) and rows
  // [0, 2): the engine was asked from row 2 and answered rows [2, 4).
  Choice c = VllmChoice(2);
  CapturedIdentity identity;
  identity.sample_id = "agent";
  identity.piece = 1;
  identity.partial = true;
  identity.stored_tokens = 3;
  absl::StatusOr<v1::Sample> s = CapturedSample(Engine::kVllm, c.choice, Model(), 2, identity);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->piece(), 1);
  EXPECT_TRUE(s->partial());
  EXPECT_THAT(Values<int32_t>(s->tokens()), ElementsAre(21, 22));
  EXPECT_THAT(Values<uint8_t>(s->token_fields().at("loss_mask")), ElementsAre(1, 1));
  EXPECT_EQ(s->routed_experts_row_offset(), 2);
}

TEST(CapturedSampleTest, SglangRawRoutingIsShapedFromTheModel) {
  std::vector<int32_t> ids(4 * 3 * 2);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 16);
  const std::string routing = absl::Base64Escape(
      absl::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
  EngineChoice choice;
  choice.prompt_ids = {1, 2, 3};
  choice.generated_ids = {4, 5};
  choice.routing_base64 = routing;
  choice.routing_dtype = "int32";
  absl::StatusOr<v1::Sample> s = CapturedSample(Engine::kSglang, choice, Model(), 0, Identity("g"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->routed_experts().dtype(), v1::INT32);
  EXPECT_THAT(s->routed_experts().shape(), ElementsAre(4, 3, 2));
}

TEST(CapturedSampleTest, UnusableChoicesAreRefusedNamingTheSampleAndWhy) {
  Choice c = VllmChoice(4);
  c.choice.unusable = absl::InvalidArgumentError("routed_experts is null");
  EXPECT_THAT(CapturedSample(Engine::kVllm, c.choice, Model(), 0, Identity("a")).status().message(),
              HasSubstr("sample \"a\": choice: routed_experts is null"));

  c = VllmChoice(4);
  c.choice.routing_base64 = {};
  EXPECT_THAT(CapturedSample(Engine::kVllm, c.choice, Model(), 0, Identity("b")).status().message(),
              HasSubstr("no routed experts"));

  c = VllmChoice(4);
  c.choice.logprobs.pop_back();
  EXPECT_THAT(CapturedSample(Engine::kVllm, c.choice, Model(), 0, Identity("c")).status().message(),
              HasSubstr("1 logprobs for 2 generated tokens"));

  c = VllmChoice(4);
  c.routing[3] = '*';
  c.choice.routing_base64 = c.routing;
  EXPECT_THAT(CapturedSample(Engine::kVllm, c.choice, Model(), 0, Identity("d")).status().message(),
              HasSubstr("sample \"d\": routed_experts"));

  c = VllmChoice(7);  // 7 rows for 5 tokens
  EXPECT_THAT(CapturedSample(Engine::kVllm, c.choice, Model(), 0, Identity("e")).status().message(),
              HasSubstr("sample \"e\": routed_experts"));

  c = VllmChoice(4);
  CapturedIdentity stored_all;
  stored_all.sample_id = "f";
  stored_all.stored_tokens = 5;
  EXPECT_THAT(CapturedSample(Engine::kVllm, c.choice, Model(), 0, stored_all).status().message(),
              HasSubstr("5 are stored already"));
}

}  // namespace
}  // namespace rollpack
