// The sampling mask through the capture port: read from each engine's
// answer (vLLM choices[i].sampling_mask, SGLang
// meta_info.output_token_sampling_mask), gathered across a vLLM stream's
// events, and stored as the captured sample's ragged token field
// sampling_mask with empty lists on the prompt (docs/layout.md section 13).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/capture/capture_test_support.h"
#include "server/capture/captured_sample.h"
#include "server/capture/engine_exchange.h"
#include "server/capture/stream_capture.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

template <typename T>
std::vector<T> Values(const v1::NDArray& array) {
  std::vector<T> out(array.data().size() / sizeof(T));
  std::memcpy(out.data(), array.data().data(), array.data().size());
  return out;
}

constexpr absl::string_view kGenerateRequest =
    R"({"token_ids":[11,12,13],"sampling_params":{"top_k":4,"max_tokens":2}})";

std::string VllmGenerateBody(absl::string_view mask) {
  return absl::StrCat(
      R"({"request_id":"req-1","choices":[{"index":0,"logprobs":null,"finish_reason":"length",)",
      R"("token_ids":[21,22],"routed_experts":"AAAA","sampling_mask":)", mask,
      R"(}],"usage":null})");
}

absl::Status Refusal(CaptureEndpoint endpoint, absl::string_view request, absl::string_view body) {
  const Padded padded(body);
  return ParseEngineResponse(endpoint, Forwarded(endpoint, request), padded.view, false).status();
}

TEST(SamplingMaskReadTest, VllmListsPerGeneratedTokenStayInTheClientsBody) {
  const ForwardedRequest request = Forwarded(CaptureEndpoint::kVllmGenerate, kGenerateRequest);
  const Padded body(VllmGenerateBody("[[21,5,9],[22]]"));
  const EngineResponse out = Parse(CaptureEndpoint::kVllmGenerate, request, body);
  ASSERT_EQ(out.choices.size(), 1u);
  EXPECT_THAT(out.choices[0].sampling_mask.ids, ElementsAre(21, 5, 9, 22));
  EXPECT_THAT(out.choices[0].sampling_mask.offsets, ElementsAre(0, 3, 4));
  EXPECT_THAT(out.client_body, HasSubstr(R"("sampling_mask":[[21,5,9],[22]])"));
  EXPECT_THAT(out.client_body, Not(HasSubstr("routed_experts")));
}

TEST(SamplingMaskReadTest, VllmNullOrAbsentIsNoMask) {
  const ForwardedRequest request = Forwarded(CaptureEndpoint::kVllmGenerate, kGenerateRequest);
  const Padded body(VllmGenerateBody("null"));
  const EngineResponse out = Parse(CaptureEndpoint::kVllmGenerate, request, body);
  ASSERT_EQ(out.choices.size(), 1u);
  EXPECT_FALSE(out.choices[0].sampling_mask.present());

  const Padded chat(
      R"({"id":"chatcmpl-1","choices":[{"index":0,"token_ids":[21],"routed_experts":"AAAA",)"
      R"("sampling_mask":[[21,3]]},{"index":1,"token_ids":[22],"routed_experts":"AAAA"}],)"
      R"("prompt_token_ids":[11]})");
  const EngineResponse two = Parse(CaptureEndpoint::kVllmChat,
                                   Forwarded(CaptureEndpoint::kVllmChat, R"({"messages":[]})"),
                                   chat);
  ASSERT_EQ(two.choices.size(), 2u);
  EXPECT_THAT(two.choices[0].sampling_mask.offsets, ElementsAre(0, 2));
  EXPECT_FALSE(two.choices[1].sampling_mask.present());
}

TEST(SamplingMaskReadTest, VllmsCsrFormIsRead) {
  const ForwardedRequest request = Forwarded(CaptureEndpoint::kVllmGenerate, kGenerateRequest);
  const Padded body(VllmGenerateBody(R"({"offsets":[0,2,3],"token_ids":[21,5,22]})"));
  const EngineResponse out = Parse(CaptureEndpoint::kVllmGenerate, request, body);
  ASSERT_EQ(out.choices.size(), 1u);
  EXPECT_THAT(out.choices[0].sampling_mask.ids, ElementsAre(21, 5, 22));
  EXPECT_THAT(out.choices[0].sampling_mask.offsets, ElementsAre(0, 2, 3));
}

TEST(SamplingMaskReadTest, AMaskThatIsNotListsOfIdsIsRefusedNamingTheElement) {
  const auto refusal = [](absl::string_view mask) {
    return std::string(
        Refusal(CaptureEndpoint::kVllmGenerate, kGenerateRequest, VllmGenerateBody(mask))
            .message());
  };
  EXPECT_THAT(refusal("[[21,-1],[22]]"), HasSubstr("choices[0].sampling_mask[0][1] is -1"));
  EXPECT_THAT(refusal("[21,22]"), HasSubstr("choices[0].sampling_mask[0] is 21"));
  EXPECT_THAT(refusal("\"x\""), HasSubstr("choices[0].sampling_mask is \"x\""));
  EXPECT_THAT(refusal(R"({"token_ids":[1,2],"offsets":[0,1,3]})"),
              HasSubstr("choices[0].sampling_mask.offsets ends at 3, token_ids holds 2"));
  EXPECT_THAT(refusal(R"({"token_ids":[1,2],"offsets":[0,2,1]})"),
              HasSubstr("offsets[2] is 1, below offsets[1] = 2"));
  EXPECT_THAT(refusal(R"({"token_ids":[1,2],"offsets":[1,2]})"),
              HasSubstr("offsets must start at 0, starts at 1"));
  EXPECT_THAT(refusal(R"({"token_ids":[1,2]})"), HasSubstr("without \"token_ids\" and"));
}

TEST(SamplingMaskReadTest, SglangGenerateMetaInfoMaskStaysWithItsLogprobs) {
  const ForwardedRequest request = Forwarded(
      CaptureEndpoint::kSglangGenerate, R"({"input_ids":[11,12,13],"return_sampling_mask":true})");
  const std::string mask_keys =
      R"("output_token_sampling_mask":[[21,4],[22,6,7]],)"
      R"("output_token_sampling_logprobs":[-0.5,-1.0],"output_token_sampling_mask_length":2)";
  const Padded body(absl::StrCat(
      R"({"text":"x","output_ids":[21,22],"meta_info":{"id":"rid-a","finish_reason":null,)",
      mask_keys, R"(,"routed_experts":"AAAA"}})"));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangGenerate, request, body);
  ASSERT_EQ(out.choices.size(), 1u);
  EXPECT_TRUE(out.choices[0].unusable.ok()) << out.choices[0].unusable;
  EXPECT_THAT(out.choices[0].sampling_mask.ids, ElementsAre(21, 4, 22, 6, 7));
  EXPECT_THAT(out.choices[0].sampling_mask.offsets, ElementsAre(0, 2, 5));
  EXPECT_THAT(out.client_body, HasSubstr(mask_keys));
}

TEST(SamplingMaskReadTest, SglangChatMaskIsReadFromTheChoicesMetaInfo) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangChat,
                R"({"messages":[],"input_ids":[11,12],"return_sampling_mask":true})");
  const Padded body(
      R"({"id":"c","choices":[{"index":0,"token_ids":[21],"logprobs":null,"meta_info":)"
      R"({"id":"c","output_token_sampling_mask":[[21,8,9]],"routed_experts":"AAAA"}}]})");
  const EngineResponse out = Parse(CaptureEndpoint::kSglangChat, request, body);
  ASSERT_EQ(out.choices.size(), 1u);
  EXPECT_THAT(out.choices[0].sampling_mask.ids, ElementsAre(21, 8, 9));
  EXPECT_THAT(out.choices[0].sampling_mask.offsets, ElementsAre(0, 3));
}

// A vLLM stream: each event's lists are its own tokens'; the choice has all.
TEST(SamplingMaskReadTest, AVllmStreamGathersEachEventsLists) {
  StreamCapture stream(CaptureEndpoint::kVllmGenerate,
                       Forwarded(CaptureEndpoint::kVllmGenerate,
                                 R"({"token_ids":[11],"stream":true,"sampling_params":{}})"),
                       false);
  const std::string first =
      R"(data: {"request_id":"r","choices":[{"index":0,"logprobs":null,"finish_reason":null,)"
      R"("token_ids":[21],"routed_experts":null,"sampling_mask":[[21,3]]}],"usage":null})"
      "\n\n";
  const std::string last =
      R"(data: {"request_id":"r","choices":[{"index":0,"logprobs":null,"finish_reason":"length",)"
      R"("token_ids":[22],"routed_experts":"AAAA","sampling_mask":[[22]]}],"usage":null})"
      "\n\n";
  std::vector<StreamEvent> events = stream.Feed(first + last);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_FALSE(events[0].final_choice.has_value());
  ASSERT_TRUE(events[1].final_choice.has_value());
  EXPECT_THAT(events[1].final_choice->generated_ids, ElementsAre(21, 22));
  EXPECT_THAT(events[1].final_choice->sampling_mask.ids, ElementsAre(21, 3, 22));
  EXPECT_THAT(events[1].final_choice->sampling_mask.offsets, ElementsAre(0, 2, 3));
}

// A choice of 3 prompt and 2 generated tokens, routing for [0, 4).
struct MaskedChoice {
  std::string routing;  // base64 of a uint8 .npy [4, 1, 1]: EngineChoice holds a view
  EngineChoice choice;
};

// Base64 of a uint8 .npy [rows, 1, 1] of experts (row mod 4).
std::string NpyRows(int64_t rows) {
  std::string dict =
      absl::StrCat("{'descr': '|u1', 'fortran_order': False, 'shape': (", rows, ", 1, 1), }");
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string npy = "\x93NUMPY\x01";
  npy += '\0';
  npy += static_cast<char>(dict.size());
  npy += '\0';
  npy += dict;
  for (int64_t r = 0; r < rows; ++r) npy += static_cast<char>(r % 4);
  return absl::Base64Escape(npy);
}

MaskedChoice Masked() {
  MaskedChoice c;
  c.routing = NpyRows(4);
  c.choice.prompt_ids = {11, 12, 13};
  c.choice.generated_ids = {21, 22};
  c.choice.routing_base64 = c.routing;
  c.choice.sampling_mask.ids = {21, 5, 9, 22};
  c.choice.sampling_mask.offsets = {0, 3, 4};
  return c;
}

CapturedIdentity Identity(int64_t stored_tokens = 0) {
  CapturedIdentity identity;
  identity.sample_id = "s";
  identity.stored_tokens = stored_tokens;
  identity.partial = stored_tokens > 0;
  identity.piece = stored_tokens > 0 ? 1 : 0;
  return identity;
}

TEST(SamplingMaskSampleTest, PromptTokensGetEmptyListsGeneratedOnesTheirs) {
  const MaskedChoice c = Masked();
  absl::StatusOr<v1::Sample> s =
      CapturedSample(Engine::kVllm, c.choice, MoeModel(1, 4, 1), 0, Identity());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->ragged_token_fields().count("sampling_mask"), 1u);
  const v1::RaggedArray& mask = s->ragged_token_fields().at("sampling_mask");
  EXPECT_EQ(mask.values().dtype(), v1::INT32);
  EXPECT_THAT(mask.values().shape(), ElementsAre(4));
  EXPECT_THAT(Values<int32_t>(mask.values()), ElementsAre(21, 5, 9, 22));
  EXPECT_EQ(mask.offsets().dtype(), v1::INT64);
  EXPECT_THAT(mask.offsets().shape(), ElementsAre(6));
  EXPECT_THAT(Values<int64_t>(mask.offsets()), ElementsAre(0, 0, 0, 0, 3, 4));
}

TEST(SamplingMaskSampleTest, ASessionPieceHoldsTheListsOfItsNewTokens) {
  const MaskedChoice c = Masked();
  for (const auto& [stored, values, offsets] :
       std::vector<std::tuple<int64_t, std::vector<int32_t>, std::vector<int64_t>>>{
           {2, {21, 5, 9, 22}, {0, 0, 3, 4}}, {4, {22}, {0, 1}}}) {
    absl::StatusOr<v1::Sample> s =
        CapturedSample(Engine::kVllm, c.choice, MoeModel(1, 4, 1), stored, Identity(stored));
    ASSERT_TRUE(s.ok()) << s.status();
    const v1::RaggedArray& mask = s->ragged_token_fields().at("sampling_mask");
    EXPECT_EQ(Values<int32_t>(mask.values()), values) << "stored " << stored;
    EXPECT_EQ(Values<int64_t>(mask.offsets()), offsets) << "stored " << stored;
    EXPECT_EQ(static_cast<int64_t>(Values<int32_t>(s->tokens()).size()) + 1,
              mask.offsets().shape(0));
  }
}

TEST(SamplingMaskSampleTest, NoMaskNoFieldAndListsNotCoveringTheTokensAreRefused) {
  MaskedChoice c = Masked();
  c.choice.sampling_mask = SamplingMaskLists();
  absl::StatusOr<v1::Sample> s =
      CapturedSample(Engine::kVllm, c.choice, MoeModel(1, 4, 1), 0, Identity());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->ragged_token_fields(), IsEmpty());

  c.choice.sampling_mask.ids = {21};
  c.choice.sampling_mask.offsets = {0, 1};
  s = CapturedSample(Engine::kVllm, c.choice, MoeModel(1, 4, 1), 0, Identity());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              HasSubstr("sample \"s\": sampling_mask: 1 lists of kept token ids for 2 generated"));
}

// An 8k-token /inference/v1/generate choice with 20 kept ids per generated
// token (a top_k = 20 sampler): the answer read and the sample made, the
// mask's share of the capture port's time per answer.
TEST(SamplingMaskSampleTest, An8kTokenMaskIsReadAndStoredQuickly) {
  constexpr int kTokens = 8192, kKept = 20;
  std::string lists, ids;
  for (int j = 0; j < kTokens; ++j) {
    absl::StrAppend(&ids, j == 0 ? "" : ",", 20000 + j);
    absl::StrAppend(&lists, j == 0 ? "[" : ",[");
    for (int k = 0; k < kKept; ++k) absl::StrAppend(&lists, k == 0 ? "" : ",", 20000 + j + k);
    lists += "]";
  }
  const auto answer = [&](bool with_mask) {
    return absl::StrCat(
        R"({"request_id":"r","choices":[{"index":0,"logprobs":null,"finish_reason":"length",)",
        R"("token_ids":[)", ids, R"(],"routed_experts":"AAAA")",
        with_mask ? absl::StrCat(R"(,"sampling_mask":[)", lists, "]") : "", "}]}");
  };
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kVllmGenerate, R"({"token_ids":[1,2,3],"sampling_params":{}})");
  const std::string routing = NpyRows(3 + kTokens - 1);
  double min_ms[2] = {0, 0};
  for (const bool with_mask : {false, true}) {
    const Padded body(answer(with_mask));
    std::vector<double> ms;
    for (int run = 0; run < 7; ++run) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<EngineResponse> out =
          ParseEngineResponse(CaptureEndpoint::kVllmGenerate, request, body.view, false);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->choices.size(), 1u);
      EngineChoice& choice = out->choices[0];
      ASSERT_EQ(choice.sampling_mask.lists(), with_mask ? kTokens : 0);
      ASSERT_EQ(choice.sampling_mask.ids.size(), with_mask ? size_t{kTokens * kKept} : 0u);
      choice.routing_base64 = routing;
      absl::StatusOr<v1::Sample> s =
          CapturedSample(Engine::kVllm, choice, MoeModel(1, 4, 1), 0, Identity());
      ASSERT_TRUE(s.ok()) << s.status();
      ASSERT_EQ(s->ragged_token_fields().count("sampling_mask"), with_mask ? 1u : 0u);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    std::sort(ms.begin(), ms.end());
    min_ms[with_mask] = ms[0];
    std::printf("8k-token vLLM answer %s (%.2f MB of JSON): parse + sample median %.2f ms, "
                "min %.2f\n",
                with_mask ? "with a 20-id mask per token" : "without a mask",
                body.view.size() / 1e6, ms[ms.size() / 2], ms[0]);
  }
  EXPECT_LT(min_ms[1], 50.0);  // generous: the VM is shared
}

}  // namespace
}  // namespace rollpack
