// The request side of engine_exchange.h: which requests are captured and
// what is spliced into them. The responses: vllm_response_test.cc and
// sglang_response_test.cc.
#include "server/capture/engine_exchange.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/capture/capture_test_support.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

std::string Refusal(CaptureEndpoint endpoint, const std::string& body) {
  absl::StatusOr<ForwardedRequest> out = ForwardRequest(endpoint, body, 0);
  if (out.ok()) return "accepted";
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(out.status().message());
}

// The six captured endpoints: each engine's POST path.
struct Captured {
  Engine engine;
  const char* path;
  CaptureEndpoint endpoint;
};
const Captured kCaptured[] = {
    {Engine::kVllm, "/v1/completions", CaptureEndpoint::kVllmCompletions},
    {Engine::kVllm, "/v1/chat/completions", CaptureEndpoint::kVllmChat},
    {Engine::kVllm, "/inference/v1/generate", CaptureEndpoint::kVllmGenerate},
    {Engine::kSglang, "/generate", CaptureEndpoint::kSglangGenerate},
    {Engine::kSglang, "/v1/chat/completions", CaptureEndpoint::kSglangChat},
    {Engine::kSglang, "/v1/completions", CaptureEndpoint::kSglangCompletions},
};

TEST(CapturedEndpointTest, TheSixEndpointsByEngineAndPostOnly) {
  for (const Captured& c : kCaptured) {
    EXPECT_EQ(CapturedEndpoint(c.engine, "POST", c.path), c.endpoint) << c.path;
  }
  EXPECT_EQ(CapturedEndpoint(Engine::kVllm, "POST", "/v1/chat/completions?trace=1"),
            CaptureEndpoint::kVllmChat)
      << "a query string is ignored";
  struct Request {
    Engine engine;
    const char* method;
    const char* target;
  };
  const Request passed_through[] = {
      {Engine::kVllm, "GET", "/v1/completions"},
      {Engine::kVllm, "post", "/v1/completions"},
      {Engine::kVllm, "POST", "/generate"},
      {Engine::kSglang, "POST", "/inference/v1/generate"},
      {Engine::kVllm, "POST", "/v1/models"},
      {Engine::kVllm, "POST", "/v1/completions/render"},
      {Engine::kVllm, "POST", "/v1/completions/"},
      {Engine::kSglang, "POST", "/health"},
  };
  for (const Request& r : passed_through) {
    EXPECT_EQ(CapturedEndpoint(r.engine, r.method, r.target), std::nullopt)
        << r.method << " " << r.target;
  }
}

TEST(EndpointNameTest, NamesEngineAndPath) {
  for (const Captured& c : kCaptured) {
    EXPECT_EQ(EndpointName(c.endpoint),
              absl::StrCat(c.engine == Engine::kVllm ? "vllm " : "sglang ", c.path));
  }
}

TEST(ForwardRequestTest, VllmCompletionsGetsTokenIdsAndLogprobs) {
  const ForwardedRequest out =
      Forwarded(CaptureEndpoint::kVllmCompletions, R"({"model":"m","prompt":"hi","max_tokens":4})");
  EXPECT_EQ(out.body,
            R"({"model":"m","prompt":"hi","max_tokens":4,"return_token_ids":true,"logprobs":0})");
  EXPECT_THAT(out.added, ElementsAre("return_token_ids", "logprobs"));
  EXPECT_FALSE(out.streaming);
  EXPECT_EQ(out.choices_asked, 1);
  EXPECT_EQ(out.batch_size, 1);
  EXPECT_THAT(out.request_prompt_ids, IsEmpty()) << "the response carries them";
  EXPECT_EQ(out.start_offset, 0);
}

TEST(ForwardRequestTest, AFieldTheClientSetIsLeftAsSet) {
  const std::string body = R"({"prompt":"hi","logprobs":5,"return_token_ids":false})";
  const ForwardedRequest out = Forwarded(CaptureEndpoint::kVllmCompletions, body);
  EXPECT_EQ(out.body, body);
  EXPECT_THAT(out.added, IsEmpty());
  // null is the engine's "not set": replaced where it stands.
  const ForwardedRequest nulls =
      Forwarded(CaptureEndpoint::kVllmCompletions, R"({"logprobs": null, "prompt": "hi"})");
  EXPECT_EQ(nulls.body, R"({"logprobs": 0, "prompt": "hi","return_token_ids":true})");
  EXPECT_THAT(nulls.added, UnorderedElementsAre("logprobs", "return_token_ids"));
}

TEST(ForwardRequestTest, KeepsTheClientsBytesAndWhitespace) {
  const ForwardedRequest out = Forwarded(CaptureEndpoint::kVllmChat,
                                         "{\n  \"messages\": [{\"role\": \"user\", \"content\": "
                                         "\"}\\\"{\"}],\n  \"temperature\": 1.0000\n}\n");
  EXPECT_EQ(out.body,
            "{\n  \"messages\": [{\"role\": \"user\", \"content\": \"}\\\"{\"}],\n  "
            "\"temperature\": 1.0000,\"return_token_ids\":true,\"logprobs\":true,"
            "\"top_logprobs\":0\n}\n");
  EXPECT_EQ(Forwarded(CaptureEndpoint::kVllmChat, "{}").body,
            R"({"return_token_ids":true,"logprobs":true,"top_logprobs":0})");
}

TEST(ForwardRequestTest, VllmChatSetsOnlyWhatIsMissing) {
  const ForwardedRequest out = Forwarded(
      CaptureEndpoint::kVllmChat, R"({"messages":[],"logprobs":true,"top_logprobs":3,"n":4})");
  EXPECT_EQ(out.body, R"({"messages":[],"logprobs":true,"top_logprobs":3,"n":4,)"
                      R"("return_token_ids":true})");
  EXPECT_THAT(out.added, ElementsAre("return_token_ids"));
  EXPECT_EQ(out.choices_asked, 4);
}

TEST(ForwardRequestTest, TheStartOffsetGoesWhereEachEngineReadsIt) {
  ForwardedRequest out = Forwarded(CaptureEndpoint::kVllmChat, R"({"messages":[]})", 120);
  EXPECT_EQ(out.body, R"({"messages":[],"return_token_ids":true,"logprobs":true,)"
                      R"("top_logprobs":0,"routed_experts_prompt_start":120})");
  EXPECT_EQ(out.start_offset, 120);
  EXPECT_THAT(out.added, ::testing::Contains("routed_experts_prompt_start"));

  out = Forwarded(CaptureEndpoint::kSglangGenerate, R"({"input_ids":[1,2]})", 7);
  EXPECT_EQ(out.body, R"({"input_ids":[1,2],"return_routed_experts":true,)"
                      R"("return_logprob":true,"routed_experts_start_len":7})");
  EXPECT_EQ(out.start_offset, 7);

  out = Forwarded(CaptureEndpoint::kVllmGenerate, R"({"token_ids":[1],"sampling_params":{}})", 5);
  EXPECT_EQ(
      out.body,
      R"({"token_ids":[1],"sampling_params":{"logprobs":0,"routed_experts_prompt_start":5}})");
  EXPECT_THAT(out.added, ElementsAre("sampling_params.logprobs",
                                     "sampling_params.routed_experts_prompt_start"));

  // The client's own start is kept and is the start asked for.
  out = Forwarded(CaptureEndpoint::kSglangChat, R"({"routed_experts_start_len":3})", 9);
  EXPECT_THAT(out.body, HasSubstr(R"("routed_experts_start_len":3,)"));
  EXPECT_THAT(out.body, ::testing::Not(HasSubstr("9")));
  EXPECT_EQ(out.start_offset, 3);
  out = Forwarded(CaptureEndpoint::kSglangChat, R"({"routed_experts_start_len":3})", 0);
  EXPECT_EQ(out.start_offset, 3);
  out = Forwarded(CaptureEndpoint::kSglangChat, R"({"routed_experts_start_len":null})", 4);
  EXPECT_THAT(out.body, HasSubstr(R"("routed_experts_start_len":4,)"));
  EXPECT_EQ(out.start_offset, 4);
}

TEST(ForwardRequestTest, VllmGenerateFieldsGoIntoSamplingParams) {
  ForwardedRequest out =
      Forwarded(CaptureEndpoint::kVllmGenerate,
                R"({"token_ids":[5,6,7],"sampling_params":{"temperature":0.5,"n":2},)"
                R"("stream":true})");
  EXPECT_EQ(out.body, R"({"token_ids":[5,6,7],"sampling_params":{"temperature":0.5,"n":2,)"
                      R"("logprobs":0},"stream":true})");
  EXPECT_THAT(out.added, ElementsAre("sampling_params.logprobs"));
  EXPECT_THAT(out.request_prompt_ids, ElementsAre(ElementsAre(5, 6, 7)));
  EXPECT_EQ(out.choices_asked, 2);
  EXPECT_TRUE(out.streaming);

  out = Forwarded(CaptureEndpoint::kVllmGenerate, R"({"token_ids":[1]})");
  EXPECT_EQ(out.body, R"({"token_ids":[1],"sampling_params":{"logprobs":0}})");
  out = Forwarded(CaptureEndpoint::kVllmGenerate, R"({"token_ids":[1],"sampling_params":null})");
  EXPECT_EQ(out.body, R"({"token_ids":[1],"sampling_params":{"logprobs":0}})");
  out = Forwarded(CaptureEndpoint::kVllmGenerate,
                  R"({"sampling_params":{"logprobs":2},"token_ids":[1]})");
  EXPECT_EQ(out.body, R"({"sampling_params":{"logprobs":2},"token_ids":[1]})");
  EXPECT_THAT(out.added, IsEmpty());
  // A top-level logprobs is not vLLM generate's: left alone, not counted.
  out = Forwarded(CaptureEndpoint::kVllmGenerate, R"({"logprobs":1,"token_ids":[1]})");
  EXPECT_THAT(out.added, ElementsAre("sampling_params.logprobs"));
}

TEST(ForwardRequestTest, SglangGenerateOnePromptABatchAndN) {
  ForwardedRequest out = Forwarded(CaptureEndpoint::kSglangGenerate,
                                   R"({"input_ids":[1,2,3],"sampling_params":{"n":3}})");
  EXPECT_EQ(out.body, R"({"input_ids":[1,2,3],"sampling_params":{"n":3},)"
                      R"("return_routed_experts":true,"return_logprob":true})");
  EXPECT_THAT(out.added, ElementsAre("return_routed_experts", "return_logprob"));
  EXPECT_THAT(out.request_prompt_ids, ElementsAre(ElementsAre(1, 2, 3)));
  EXPECT_EQ(out.batch_size, 1);
  EXPECT_EQ(out.choices_asked, 3);

  out = Forwarded(CaptureEndpoint::kSglangGenerate,
                  R"({"input_ids":[[1,2],[3]],"sampling_params":[{"n":2},{"n":2}],)"
                  R"("return_logprob":[true,true]})");
  EXPECT_THAT(out.request_prompt_ids, ElementsAre(ElementsAre(1, 2), ElementsAre(3)));
  EXPECT_EQ(out.batch_size, 2);
  EXPECT_EQ(out.choices_asked, 4);
  EXPECT_THAT(out.added, ElementsAre("return_routed_experts")) << "return_logprob was set";

  out = Forwarded(CaptureEndpoint::kSglangGenerate, R"({"text":["a","b","c"]})");
  EXPECT_THAT(out.request_prompt_ids, IsEmpty());
  EXPECT_EQ(out.batch_size, 3);
  EXPECT_EQ(out.choices_asked, 3);
  out = Forwarded(CaptureEndpoint::kSglangGenerate, R"({"text":"a","stream":true})");
  EXPECT_EQ(out.batch_size, 1);
  EXPECT_TRUE(out.streaming);
}

TEST(ForwardRequestTest, SglangOpenAiEndpoints) {
  ForwardedRequest out =
      Forwarded(CaptureEndpoint::kSglangChat, R"({"messages":[],"input_ids":[4,5],"n":2})");
  EXPECT_EQ(out.body, R"({"messages":[],"input_ids":[4,5],"n":2,"return_routed_experts":true,)"
                      R"("return_meta_info":true,"return_token_ids":true,)"
                      R"("return_prompt_token_ids":true,"logprobs":true,"top_logprobs":0})");
  EXPECT_THAT(out.request_prompt_ids, ElementsAre(ElementsAre(4, 5)));
  EXPECT_EQ(out.choices_asked, 2);

  out = Forwarded(CaptureEndpoint::kSglangCompletions, R"({"prompt":[9,8],"logprobs":1})");
  EXPECT_EQ(
      out.body,
      R"({"prompt":[9,8],"logprobs":1,"return_routed_experts":true,"return_token_ids":true})");
  EXPECT_THAT(out.request_prompt_ids, ElementsAre(ElementsAre(9, 8)));
  out = Forwarded(CaptureEndpoint::kSglangCompletions, R"({"prompt":[[9],[8,7]],"n":2})");
  EXPECT_THAT(out.request_prompt_ids, ElementsAre(ElementsAre(9), ElementsAre(8, 7)));
  EXPECT_EQ(out.batch_size, 2);
  EXPECT_EQ(out.choices_asked, 4);
  out = Forwarded(CaptureEndpoint::kSglangCompletions, R"({"prompt":"text"})");
  EXPECT_THAT(out.request_prompt_ids, IsEmpty());
  EXPECT_EQ(out.batch_size, 1);
}

TEST(ForwardRequestTest, VllmCompletionsBatchesCountChoices) {
  const ForwardedRequest out =
      Forwarded(CaptureEndpoint::kVllmCompletions, R"({"prompt":["a","b"],"n":3})");
  EXPECT_EQ(out.batch_size, 2);
  EXPECT_EQ(out.choices_asked, 6);
  EXPECT_THAT(out.request_prompt_ids, IsEmpty());
}

TEST(ForwardRequestTest, RefusesWhatIsNotTheEndpointsJsonNamingTheField) {
  const auto completions = CaptureEndpoint::kVllmCompletions;
  EXPECT_THAT(Refusal(completions, "not json"), HasSubstr("the request"));
  EXPECT_THAT(Refusal(completions, "[1,2]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(Refusal(completions, R"({"prompt":"a",)"), HasSubstr("the request"));
  EXPECT_THAT(Refusal(completions, R"({"prompt":"a"} {})"), HasSubstr("after its JSON"));
  EXPECT_THAT(Refusal(completions, R"({"stream":"yes"})"),
              HasSubstr("stream is \"yes\", not true or false"));
  EXPECT_THAT(Refusal(completions, R"({"n":0})"), HasSubstr("n is 0"));
  EXPECT_THAT(Refusal(completions, R"({"n":"2"})"), HasSubstr("n is \"2\", not an integer"));
  EXPECT_THAT(Refusal(completions, R"({"prompt":[1,[2]]})"), HasSubstr("prompt[1]"));
  EXPECT_THAT(Refusal(completions, R"({"prompt":[1,-2]})"),
              HasSubstr("prompt[1] is -2, not a token id"));
  EXPECT_THAT(Refusal(completions, R"({"prompt":5})"), HasSubstr("prompt is 5"));
  EXPECT_THAT(Refusal(completions, R"({"routed_experts_prompt_start":-1})"),
              HasSubstr("routed_experts_prompt_start is -1"));
  EXPECT_THAT(Refusal(CaptureEndpoint::kVllmGenerate, R"({"sampling_params":5})"),
              HasSubstr("sampling_params is 5, not an object"));
  EXPECT_THAT(Refusal(CaptureEndpoint::kVllmGenerate, R"({"token_ids":["a"]})"),
              HasSubstr("token_ids[0] is \"a\", not a token id"));
  EXPECT_THAT(Refusal(CaptureEndpoint::kVllmGenerate, R"({"sampling_params":{"n":1.5}})"),
              HasSubstr("sampling_params.n is 1.5"));
  EXPECT_THAT(Refusal(CaptureEndpoint::kSglangGenerate, R"({"input_ids":[[1],"x"]})"),
              HasSubstr("input_ids[1]"));
  EXPECT_THAT(Refusal(CaptureEndpoint::kSglangGenerate, R"({"input_ids":[4294967296]})"),
              HasSubstr("input_ids[0] is 4294967296, not a token id"));
  EXPECT_THAT(Refusal(CaptureEndpoint::kSglangChat, R"({"input_ids":{}})"),
              HasSubstr("input_ids is an object, not text, token ids or a list of either"));
}

}  // namespace
}  // namespace rollpack
