// ParseEngineResponse on SGLang's answers. Each test writes the response as
// SGLang serializes it (orjson, fields it was not asked for left out, the
// OpenAI choices' logprobs null) for the request as rollpackd forwarded it
// and for the request as the client sent it, minus the routing: the
// client's body must be the second, byte for byte.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/capture/capture_test_support.h"
#include "server/capture/engine_exchange.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct Item {
  std::string id;
  std::vector<int> prompt;
  std::vector<int> generated;
  std::vector<double> logprobs;
  std::string routing;
};

struct Asked {
  bool logprobs = false;    // return_logprob / logprobs
  bool routing = false;     // the routing (and its dtype) in meta_info
  bool meta_info = false;   // chat: return_meta_info
  bool token_ids = false;   // OpenAI endpoints: return_token_ids as the build writes it
  bool prompt_ids = false;  // chat: return_prompt_token_ids; completions: with token_ids
  bool sglext = false;      // sglext.routed_experts
  bool cached_details = false;
  int start_echo = -1;
};

std::string MetaInfo(const Item& item, const Asked& asked) {
  std::string logprobs;
  if (asked.logprobs) {
    std::vector<std::string> in, out;
    for (size_t j = 0; j < item.prompt.size(); ++j) {
      in.push_back(absl::StrCat("[", j == 0 ? "null" : "-0.5", ",", item.prompt[j], ",null]"));
    }
    for (size_t j = 0; j < item.generated.size(); ++j) {
      out.push_back(absl::StrCat("[", item.logprobs[j], ",", item.generated[j], ",null]"));
    }
    logprobs = absl::StrCat(R"("input_token_logprobs":[)", absl::StrJoin(in, ","),
                            R"(],"output_token_logprobs":[)", absl::StrJoin(out, ","),
                            R"(],"output_token_logprobs_length":)", item.generated.size(), ",");
  }
  return absl::StrCat(
      R"({"id":")", item.id, R"(","finish_reason":{"type":"length","length":2},)",
      R"("prompt_tokens":)", item.prompt.size(), R"(,"weight_version":"default",)",
      R"("num_retractions":0,)", logprobs, R"("reasoning_tokens":0,"completion_tokens":)",
      item.generated.size(), R"(,"cached_tokens":0,)",
      asked.routing ? absl::StrCat(R"("routed_experts":")", item.routing,
                                   R"(","routed_experts_dtype":"int16",)")
                    : "",
      asked.start_echo >= 0 ? absl::StrCat(R"("routed_experts_start_len":)", asked.start_echo, ",")
                            : "",
      R"("e2e_latency":0.25})");
}

std::string GenerateItem(const Item& item, const Asked& asked) {
  return absl::StrCat(R"({"text":" ok","output_ids":)", Ids(item.generated), R"(,"meta_info":)",
                      MetaInfo(item, asked), "}");
}

std::string Generate(const std::vector<Item>& items, const Asked& asked, bool list) {
  std::vector<std::string> parts;
  for (const Item& item : items) parts.push_back(GenerateItem(item, asked));
  return list ? absl::StrCat("[", absl::StrJoin(parts, ","), "]") : parts[0];
}

std::string Sglext(const std::vector<Item>& items, const Asked& asked) {
  std::vector<std::string> members;
  if (asked.sglext)
    members.push_back(absl::StrCat(R"("routed_experts":")", items[0].routing, "\""));
  if (asked.cached_details) members.push_back(R"("cached_tokens_details":{"device":3,"host":0})");
  if (members.empty()) return "";
  return absl::StrCat(R"(,"sglext":{)", absl::StrJoin(members, ","), "}");
}

std::string Chat(const std::vector<Item>& items, const Asked& asked) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& item = items[i];
    std::string logprobs = "null";
    if (asked.logprobs) {
      std::vector<std::string> content;
      for (size_t j = 0; j < item.generated.size(); ++j) {
        content.push_back(absl::StrCat(R"({"token":"t","bytes":[116],"logprob":)", item.logprobs[j],
                                       R"(,"top_logprobs":[]})"));
      }
      logprobs = absl::StrCat(R"({"content":[)", absl::StrJoin(content, ","), "]}");
    }
    parts.push_back(absl::StrCat(
        R"({"index":)", i,
        R"(,"message":{"role":"assistant","content":"hi","reasoning_content":null,)",
        R"("tool_calls":null},"logprobs":)", logprobs,
        R"(,"finish_reason":"length","matched_stop":null)",
        asked.prompt_ids ? absl::StrCat(R"(,"prompt_token_ids":)", Ids(item.prompt)) : "",
        asked.token_ids ? absl::StrCat(R"(,"token_ids":)", Ids(item.generated)) : "",
        asked.meta_info ? absl::StrCat(R"(,"meta_info":)", MetaInfo(item, asked)) : "", "}"));
  }
  return absl::StrCat(R"({"id":")", items[0].id,
                      R"(","object":"chat.completion","created":1,"model":"default",)",
                      R"("choices":[)", absl::StrJoin(parts, ","),
                      R"(],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,)",
                      R"("prompt_tokens_details":null,"reasoning_tokens":0},)",
                      R"("metadata":{"weight_version":"default"})", Sglext(items, asked), "}");
}

std::string Completions(const std::vector<Item>& items, const Asked& asked) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& item = items[i];
    std::string logprobs = "null";
    if (asked.logprobs) {
      std::vector<std::string> values;
      for (double lp : item.logprobs) values.push_back(absl::StrCat(lp));
      logprobs =
          absl::StrCat(R"({"text_offset":[-1,-1],"token_logprobs":[)", absl::StrJoin(values, ","),
                       R"(],"tokens":["a","b"],)", R"("top_logprobs":[]})");
    }
    parts.push_back(absl::StrCat(
        R"({"index":)", i, R"(,"text":" ok","logprobs":)", logprobs,
        R"(,"finish_reason":"length","matched_stop":null)",
        asked.token_ids ? absl::StrCat(R"(,"token_ids":)", Ids(item.generated)) : "",
        asked.prompt_ids ? absl::StrCat(R"(,"prompt_token_ids":)", Ids(item.prompt)) : "", "}"));
  }
  return absl::StrCat(R"({"id":")", items[0].id,
                      R"(","object":"text_completion","created":1,"model":"default","choices":[)",
                      absl::StrJoin(parts, ","),
                      R"(],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2},)",
                      R"("metadata":{"weight_version":"default"})", Sglext(items, asked), "}");
}

const Item kA{"rid-a", {11, 12, 13}, {21, 22}, {-0.25, -1.5}, "AAAAAQAAAAIAAAAD"};
const Item kB{"rid-b", {11, 12, 13}, {31, 32}, {-0.5, -0.125}, "BAAAAAUAAAAGAAAA"};

void ExpectChoice(const EngineChoice& c, const Item& item) {
  EXPECT_TRUE(c.unusable.ok()) << c.unusable;
  EXPECT_EQ(c.prompt_ids, std::vector<int32_t>(item.prompt.begin(), item.prompt.end()));
  EXPECT_EQ(c.generated_ids, std::vector<int32_t>(item.generated.begin(), item.generated.end()));
  ASSERT_EQ(c.logprobs.size(), item.logprobs.size());
  for (size_t j = 0; j < item.logprobs.size(); ++j) {
    EXPECT_THAT(c.logprobs[j], FloatEq(static_cast<float>(item.logprobs[j])));
  }
  EXPECT_EQ(c.routing_base64, item.routing);
}

TEST(SglangGenerateTest, OneItem) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangGenerate, R"({"input_ids":[11,12,13]})");
  const Padded body(Generate({kA}, {true, true}, false));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangGenerate, request, body);
  EXPECT_EQ(out.client_body, Generate({kA}, {}, false));
  EXPECT_EQ(out.response_id, "rid-a");
  ASSERT_EQ(out.choices.size(), 1u);
  ExpectChoice(out.choices[0], kA);
  EXPECT_EQ(out.choices[0].routing_dtype, "int16");
  EXPECT_EQ(out.choices[0].engine_id, "rid-a");
  EXPECT_EQ(out.stripped_bytes, static_cast<int64_t>(kA.routing.size()));
}

TEST(SglangGenerateTest, AListForNAboveOne) {
  const ForwardedRequest request = Forwarded(
      CaptureEndpoint::kSglangGenerate, R"({"input_ids":[11,12,13],"sampling_params":{"n":2}})");
  const Padded body(Generate({kA, kB}, {true, true}, true));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangGenerate, request, body);
  EXPECT_EQ(out.client_body, Generate({kA, kB}, {}, true));
  EXPECT_EQ(out.response_id, "rid-a") << "the first item's meta_info.id";
  ASSERT_EQ(out.choices.size(), 2u);
  ExpectChoice(out.choices[0], kA);
  ExpectChoice(out.choices[1], kB);
  EXPECT_EQ(out.choices[1].engine_id, "rid-b");
}

TEST(SglangGenerateTest, ABatchOfPromptsTakesEachItemsPrompt) {
  const ForwardedRequest request = Forwarded(
      CaptureEndpoint::kSglangGenerate,
      R"({"input_ids":[[11,12,13],[14]],"sampling_params":{"n":2},"return_logprob":true})");
  Item c = kA, d = kB;
  c.prompt = {14};
  d.prompt = {14};
  const Padded body(Generate({kA, kB, c, d}, {true, true}, true));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangGenerate, request, body);
  EXPECT_EQ(out.client_body, Generate({kA, kB, c, d}, {true, false}, true))
      << "the client asked return_logprob: its keys stay";
  ASSERT_EQ(out.choices.size(), 4u);
  ExpectChoice(out.choices[1], kB);
  ExpectChoice(out.choices[2], c);
  ExpectChoice(out.choices[3], d);
}

TEST(SglangGenerateTest, WithoutRoutingOrPromptIdsTheChoiceIsUnusable) {
  ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangGenerate, R"({"input_ids":[11,12,13]})");
  const Padded no_routing(Generate({kA}, {true, false}, false));
  EngineResponse out = Parse(CaptureEndpoint::kSglangGenerate, request, no_routing);
  EXPECT_THAT(std::string(out.choices[0].unusable.message()),
              HasSubstr("the response: no meta_info.routed_experts in the response"));
  EXPECT_EQ(out.client_body, Generate({kA}, {}, false));

  request = Forwarded(CaptureEndpoint::kSglangGenerate, R"({"text":"hello"})");
  const Padded text_prompt(Generate({kA}, {true, true}, false));
  out = Parse(CaptureEndpoint::kSglangGenerate, request, text_prompt);
  EXPECT_THAT(std::string(out.choices[0].unusable.message()), HasSubstr("no prompt token ids"));
  // An item that carries its prompt ids (return_prompt_token_ids) is usable.
  const Padded with_prompt(
      R"({"text":"x","output_ids":[5],"prompt_token_ids":[1,2],"meta_info":{"id":"r",)"
      R"("output_token_logprobs":[[-0.5,5,null]],"routed_experts":"QUJD"}})");
  out = Parse(CaptureEndpoint::kSglangGenerate, request, with_prompt);
  EXPECT_TRUE(out.choices[0].unusable.ok()) << out.choices[0].unusable;
  EXPECT_THAT(out.choices[0].prompt_ids, ElementsAre(1, 2));
  EXPECT_EQ(out.client_body,
            R"({"text":"x","output_ids":[5],"prompt_token_ids":[1,2],"meta_info":{"id":"r"}})");
}

TEST(SglangGenerateTest, TheEchoedStartAddedByRollpackdGoes) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangGenerate, R"({"input_ids":[11,12,13]})", 2);
  Asked engine{true, true};
  engine.start_echo = 2;
  const Padded body(Generate({kA}, engine, false));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangGenerate, request, body);
  EXPECT_EQ(out.client_body, Generate({kA}, {}, false));
}

TEST(SglangGenerateTest, NotTheEndpointsJson) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangGenerate, R"({"input_ids":[1]})");
  auto refusal = [&](const std::string& json) {
    const Padded body(json);
    absl::StatusOr<EngineResponse> out =
        ParseEngineResponse(CaptureEndpoint::kSglangGenerate, request, body.view, false);
    return out.ok() ? std::string("accepted") : std::string(out.status().message());
  };
  EXPECT_THAT(refusal(R"("text")"), HasSubstr("not a JSON object or array"));
  EXPECT_THAT(refusal(R"([1])"), HasSubstr("item 0"));
  EXPECT_THAT(refusal(R"({"meta_info":[]})"), HasSubstr("the response.meta_info is an array"));
  EXPECT_THAT(refusal(R"({"meta_info":{"output_token_logprobs":[[-1.0]]}})"),
              HasSubstr("output_token_logprobs[0] is not a [logprob, token id, text] list"));
  EXPECT_THAT(refusal(R"([{"output_ids":[1]},{"output_ids":[-1]}])"),
              HasSubstr("[1].output_ids[0] is -1, not a token id"));
  EXPECT_THAT(refusal("{"), HasSubstr("sglang /generate"));
}

TEST(SglangChatTest, WhatTheAddedFieldsCausedGoes) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangChat, R"({"messages":[],"input_ids":[11,12,13],"n":2})");
  Asked engine;
  engine.logprobs = engine.routing = engine.meta_info = engine.token_ids = engine.sglext = true;
  const Padded body(Chat({kA, kB}, engine));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangChat, request, body);
  EXPECT_EQ(out.client_body, Chat({kA, kB}, {}));
  EXPECT_EQ(out.response_id, "rid-a");
  ASSERT_EQ(out.choices.size(), 2u);
  ExpectChoice(out.choices[0], kA);
  ExpectChoice(out.choices[1], kB);
  EXPECT_EQ(out.choices[1].routing_dtype, "int16");
  EXPECT_EQ(out.choices[1].engine_id, "rid-b");
  EXPECT_EQ(out.stripped_bytes, static_cast<int64_t>(2 * kA.routing.size() + kB.routing.size()))
      << "each choice's meta_info and sglext";
}

TEST(SglangChatTest, ABuildWithoutTokenIdsGivesThemThroughMetaInfo) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangChat, R"({"messages":[],"input_ids":[11,12,13]})");
  Asked engine;
  engine.logprobs = engine.routing = engine.meta_info = engine.sglext = true;
  const Padded body(Chat({kA}, engine));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangChat, request, body);
  EXPECT_EQ(out.client_body, Chat({kA}, {}));
  ExpectChoice(out.choices[0], kA);
}

TEST(SglangChatTest, AMetaInfoTheClientAskedForStaysWithoutRoutingOrAddedLogprobs) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangChat,
                R"({"messages":[],"return_meta_info":true,"return_prompt_token_ids":true})");
  Asked engine;
  engine.logprobs = engine.routing = engine.meta_info = engine.token_ids = engine.sglext = true;
  engine.prompt_ids = engine.cached_details = true;
  const Padded body(Chat({kA}, engine));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangChat, request, body);
  Asked client;
  client.meta_info = client.prompt_ids = client.cached_details = true;
  EXPECT_EQ(out.client_body, Chat({kA}, client))
      << "sglext keeps cached_tokens_details; prompt_token_ids answer the client";
  ExpectChoice(out.choices[0], kA);

  // The client asked logprobs too: meta_info keeps their keys.
  const ForwardedRequest asked = Forwarded(
      CaptureEndpoint::kSglangChat,
      R"({"messages":[],"return_meta_info":true,"logprobs":true,"input_ids":[11,12,13]})");
  engine.prompt_ids = engine.cached_details = false;
  const Padded body2(Chat({kA}, engine));
  Asked client2;
  client2.meta_info = client2.logprobs = true;
  EXPECT_EQ(Parse(CaptureEndpoint::kSglangChat, asked, body2).client_body, Chat({kA}, client2));
}

TEST(SglangChatTest, KeepRoutingKeepsMetaInfoAndSglext) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangChat, R"({"messages":[],"input_ids":[11,12,13]})");
  Asked engine;
  engine.logprobs = engine.routing = engine.meta_info = engine.token_ids = engine.sglext = true;
  const Padded body(Chat({kA}, engine));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangChat, request, body, true);
  Asked client;
  client.meta_info = client.routing = client.sglext = true;
  client.logprobs = false;
  // meta_info stays (it holds the routing) but loses the logprob keys.
  EXPECT_EQ(out.client_body, Chat({kA}, client));
  EXPECT_EQ(out.stripped_bytes, 0);
}

TEST(SglangChatTest, ChoiceZeroFallsBackOnSglextAndNoPromptIsUnusable) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangChat, R"({"messages":[],"return_meta_info":false})");
  Asked engine;
  engine.logprobs = engine.token_ids = engine.sglext = true;
  const Padded body(Chat({kA}, engine));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangChat, request, body);
  EXPECT_EQ(out.choices[0].routing_base64, kA.routing);
  EXPECT_THAT(std::string(out.choices[0].unusable.message()),
              HasSubstr("no prompt token ids (prompt_token_ids or the request's input_ids)"));
}

TEST(SglangCompletionsTest, OnlyChoiceZeroHasRouting) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangCompletions, R"({"prompt":"hi","n":2})");
  Asked engine;
  engine.logprobs = engine.token_ids = engine.prompt_ids = engine.sglext = true;
  const Padded body(Completions({kA, kB}, engine));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangCompletions, request, body);
  EXPECT_EQ(out.client_body, Completions({kA, kB}, {}));
  EXPECT_EQ(out.response_id, "rid-a");
  ASSERT_EQ(out.choices.size(), 2u);
  ExpectChoice(out.choices[0], kA);
  EXPECT_THAT(std::string(out.choices[1].unusable.message()),
              HasSubstr("choices[1]: SGLang /v1/completions returns the routing of choice 0"));
  EXPECT_EQ(out.stripped_bytes, static_cast<int64_t>(kA.routing.size()));
}

TEST(SglangCompletionsTest, PromptIdsFromTheRequestAndLogprobsTheClientAsked) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangCompletions, R"({"prompt":[11,12,13],"logprobs":0})");
  Asked engine;
  engine.logprobs = engine.token_ids = engine.sglext = engine.cached_details = true;
  const Padded body(Completions({kA}, engine));
  const EngineResponse out = Parse(CaptureEndpoint::kSglangCompletions, request, body);
  Asked client;
  client.logprobs = client.cached_details = true;
  EXPECT_EQ(out.client_body, Completions({kA}, client));
  ExpectChoice(out.choices[0], kA);

  // An engine without routing capture: no sglext at all.
  engine.sglext = engine.cached_details = false;
  const Padded bare(Completions({kA}, engine));
  EXPECT_THAT(
      std::string(
          Parse(CaptureEndpoint::kSglangCompletions, request, bare).choices[0].unusable.message()),
      HasSubstr("no sglext.routed_experts"));
}

TEST(SglangCompletionsTest, NullRoutingInSglext) {
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangCompletions, R"({"prompt":[11,12,13]})");
  const Padded body(R"({"id":"x","choices":[{"index":0,"logprobs":null,"token_ids":[5]}],)"
                    R"("sglext":{"routed_experts":null}})");
  const EngineResponse out = Parse(CaptureEndpoint::kSglangCompletions, request, body);
  EXPECT_THAT(std::string(out.choices[0].unusable.message()),
              HasSubstr("sglext.routed_experts is null"));
  EXPECT_EQ(out.client_body, R"({"id":"x","choices":[{"index":0,"logprobs":null}]})");
  EXPECT_THAT(out.choices[0].logprobs, IsEmpty());
}

TEST(SglangCompletionsTest, AnSglextTheEngineLeftEmptyStays) {
  // Only an sglext emptied by taking its routing out goes (capture_fuzzer).
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangCompletions, R"({"prompt":[11,12,13]})");
  const Padded body(R"({"id":"x","choices":[{"index":0,"token_ids":[5]}],"sglext":{}})");
  const EngineResponse out = Parse(CaptureEndpoint::kSglangCompletions, request, body);
  EXPECT_EQ(out.client_body, R"({"id":"x","choices":[{"index":0}],"sglext":{}})");
}

TEST(SglangCompletionsTest, AChoicesOwnSglextIsItsRouting) {
  // Builds that put sglext (the Python adapter: sgl_ext) on each choice.
  const ForwardedRequest request =
      Forwarded(CaptureEndpoint::kSglangCompletions, R"({"prompt":[11,12,13],"n":2})");
  const Padded body(
      R"({"id":"x","choices":[{"index":0,"token_ids":[5],"sgl_ext":{"routed_experts":"QUJD"}},)"
      R"({"index":1,"token_ids":[6],"sglext":{"routed_experts":"REVG","other":1}}]})");
  const EngineResponse out = Parse(CaptureEndpoint::kSglangCompletions, request, body);
  ASSERT_EQ(out.choices.size(), 2u);
  EXPECT_TRUE(out.choices[1].unusable.ok()) << out.choices[1].unusable;
  EXPECT_EQ(out.choices[0].routing_base64, "QUJD");
  EXPECT_EQ(out.choices[1].routing_base64, "REVG");
  EXPECT_EQ(out.client_body,
            R"({"id":"x","choices":[{"index":0},{"index":1,"sglext":{"other":1}}]})");
  EXPECT_EQ(out.stripped_bytes, 8);
}

}  // namespace
}  // namespace rollpack
