// The vLLM and SGLang response readers (vllm_response.cc, sglang_response.cc)
// and what they share: a walk over the engine's JSON in document order
// (simdjson on demand reads forward only) that collects each choice as
// shared/spec/capture.md section 3.1 reads it and records the edits of
// section 4, and the reads of the OpenAI-style fields both engines return.
#ifndef ROLLPACK_SERVER_CAPTURE_RESPONSE_WALK_H_
#define ROLLPACK_SERVER_CAPTURE_RESPONSE_WALK_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/capture/engine_exchange.h"
#include "server/capture/json_splice.h"
#include "server/capture/json_values.h"
#include "server/capture/response_splice.h"
#include "simdjson.h"

namespace rollpack {

// A choice as the walk reads it, before what it lacks is known.
struct ChoiceReading {
  EngineChoice choice;
  std::string where;  // "choices[1]", "[1]" (SGLang /generate items)
  bool has_generated = false;
  bool has_prompt = false;
  bool has_routing = false;
  // Why the routing cannot be used (null, not a string), when it was seen.
  std::string routing_problem;
  // Why the logprobs cannot be used (a null among them), when so.
  std::string logprob_problem;
};

class ResponseWalk {
 public:
  ResponseWalk(const ForwardedRequest& request, bool keep_routing, ResponseSplice& splice)
      : request_(request), keep_routing_(keep_routing), splice_(splice) {}

  const ForwardedRequest& request() const { return request_; }
  bool keep_routing() const { return keep_routing_; }
  ResponseSplice& splice() { return splice_; }
  // Whether rollpackd added `field` to the request (ForwardedRequest::added).
  bool Added(absl::string_view field) const;

  std::string response_id;
  std::vector<ChoiceReading> choices;
  ChoiceReading& NewChoice(std::string where);

  // visit(key, value, fields) for each field of `object` (named `what` in
  // errors), in order; then the object's edits are recorded.
  template <typename Visit>
  absl::Status Fields(simdjson::ondemand::object& object, absl::string_view what, Visit&& visit);
  // The same for the value `value`, which must be an object.
  template <typename Visit>
  absl::Status Object(JsonValue& value, absl::string_view what, Visit&& visit);
  // The same for the document's root object.
  template <typename Visit>
  absl::Status Root(Visit&& visit);
  // visit(index, element) for each element of the array `value`.
  template <typename Visit>
  absl::Status Array(JsonValue& value, absl::string_view what, Visit&& visit);

  // The value of a routing key (`what`): the choice's routing as a view of
  // the body, or why there is none. The key is removed from the client's
  // body unless keep_routing.
  absl::Status Routing(JsonValue& value, absl::string_view what, ChoiceReading& reading,
                       ObjectFields& fields);

  // Prompt ids from the request for choice `index` of `count` (one prompt,
  // or a batch of prompts with count / batch choices each). False if none.
  bool PromptFromRequest(size_t index, size_t count, std::vector<int32_t>& out) const;

  // The choices, each unusable (naming its field) if it lacks routing,
  // generated ids or prompt ids, or has null logprobs.
  std::vector<EngineChoice> FinishChoices(absl::string_view routing_field,
                                          absl::string_view generated_field,
                                          absl::string_view prompt_field);

 private:
  const ForwardedRequest& request_;
  const bool keep_routing_;
  ResponseSplice& splice_;
};

// An OpenAI chat choice's "logprobs" ({"content": [{"logprob": x, ...}]})
// or a completion choice's ({"token_logprobs": [x, ...]}), into
// `reading.choice.logprobs`; null: none returned.
absl::Status ReadChatLogprobs(JsonValue& value, absl::string_view what, ChoiceReading& reading);
absl::Status ReadCompletionLogprobs(JsonValue& value, absl::string_view what,
                                    ChoiceReading& reading);

// A choice's "token_ids" (the generated ids) or "prompt_token_ids" (`key`),
// into `reading.choice`; null: none returned.
absl::Status ReadChoiceTokenIds(absl::string_view key, JsonValue& value, ChoiceReading& reading);

// Each engine's reader (vllm_response.cc, sglang_response.cc): reads the
// response `walk` parses as `endpoint` (one of that engine's) into
// walk.response_id and `choices`, recording the client body's edits.
// INVALID_ARGUMENT naming the field when it is not that endpoint's JSON.
absl::Status ReadVllmResponse(CaptureEndpoint endpoint, ResponseWalk& walk,
                              std::vector<EngineChoice>& choices);
absl::Status ReadSglangResponse(CaptureEndpoint endpoint, ResponseWalk& walk,
                                std::vector<EngineChoice>& choices);

template <typename Visit>
absl::Status ResponseWalk::Fields(simdjson::ondemand::object& object, absl::string_view what,
                                  Visit&& visit) {
  return VisitFields(splice_.doc(), splice_.text(), object, what, splice_.edits(), visit);
}

template <typename Visit>
absl::Status ResponseWalk::Object(JsonValue& value, absl::string_view what, Visit&& visit) {
  simdjson::ondemand::object object;
  if (value.get_object().get(object)) return NotA(what, value, "an object");
  return Fields(object, what, visit);
}

template <typename Visit>
absl::Status ResponseWalk::Root(Visit&& visit) {
  simdjson::ondemand::object object;
  if (auto error = splice_.doc().get_object().get(object)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the response is not a JSON object (", simdjson::error_message(error), ")"));
  }
  return Fields(object, "the response", visit);
}

template <typename Visit>
absl::Status ResponseWalk::Array(JsonValue& value, absl::string_view what, Visit&& visit) {
  simdjson::ondemand::array array;
  if (value.get_array().get(array)) return NotA(what, value, "an array");
  size_t i = 0;
  for (auto element : array) {
    JsonValue item;
    if (auto error = std::move(element).get(item)) {
      return JsonError(absl::StrCat(what, "[", i, "]"), error);
    }
    if (absl::Status s = visit(i, item); !s.ok()) return s;
    ++i;
  }
  return absl::OkStatus();
}

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_RESPONSE_WALK_H_
