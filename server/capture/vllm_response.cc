// vLLM's answers to the captured endpoints (shared/spec/capture.md section
// 3.1): /v1/completions, /v1/chat/completions and /inference/v1/generate,
// each choice with its routing as base64 .npy in choices[i].routed_experts
// and, from an engine started with --return-sampling-mask, its sampling mask
// in choices[i].sampling_mask.
// vLLM writes every field of its response models, null when not asked
// (pydantic's model_dump), so what rollpackd's fields caused is set back to
// null rather than removed.
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/capture/engine_exchange.h"
#include "server/capture/response_walk.h"
#include "server/capture/sampling_mask_json.h"

namespace rollpack {
namespace {

absl::Status ReadChoice(CaptureEndpoint endpoint, ResponseWalk& walk, size_t index,
                        JsonValue& value) {
  ChoiceReading& reading = walk.NewChoice(absl::StrCat("choices[", index, "]"));
  const std::string& where = reading.where;
  // Chat and /inference/v1/generate write chat-style logprobs.
  const bool chat_logprobs = endpoint != CaptureEndpoint::kVllmCompletions;
  const bool added_token_ids = walk.Added("return_token_ids");
  const bool added_logprobs = walk.Added("logprobs") || walk.Added("sampling_params.logprobs");
  const bool added_start = walk.Added("routed_experts_prompt_start") ||
                           walk.Added("sampling_params.routed_experts_prompt_start");
  return walk.Object(
      value, where,
      [&](absl::string_view key, JsonValue& field_value, ObjectFields& fields) -> absl::Status {
        if (key == "token_ids" || key == "prompt_token_ids") {
          RETURN_IF_ERROR(ReadChoiceTokenIds(key, field_value, reading));
          if (added_token_ids) fields.Replace("null");
        } else if (key == "logprobs") {
          const std::string what = absl::StrCat(where, ".logprobs");
          RETURN_IF_ERROR(chat_logprobs ? ReadChatLogprobs(field_value, what, reading)
                                        : ReadCompletionLogprobs(field_value, what, reading));
          if (added_logprobs) fields.Replace("null");
        } else if (key == "routed_experts") {
          RETURN_IF_ERROR(
              walk.Routing(field_value, absl::StrCat(where, ".routed_experts"), reading, fields));
        } else if (key == "routed_experts_prompt_start") {
          if (added_start) fields.Remove();  // echoed by some builds
        } else if (key == "sampling_mask") {
          // Written by an engine started with --return-sampling-mask; kept
          // in the client's body (no field of rollpackd's asked for it).
          RETURN_IF_ERROR(ReadSamplingMask(field_value, absl::StrCat(where, ".sampling_mask"),
                                           reading.choice.sampling_mask));
        }
        return absl::OkStatus();
      });
}

}  // namespace

absl::Status ReadVllmResponse(CaptureEndpoint endpoint, ResponseWalk& walk,
                              std::vector<EngineChoice>& choices) {
  const bool generate = endpoint == CaptureEndpoint::kVllmGenerate;
  const absl::string_view id_key = generate ? "request_id" : "id";
  std::optional<std::vector<int32_t>> response_prompt;
  bool saw_choices = false;
  RETURN_IF_ERROR(
      walk.Root([&](absl::string_view key, JsonValue& value, ObjectFields& fields) -> absl::Status {
        if (key == id_key) {
          if (!IsNull(value)) {
            ASSIGN_OR_RETURN(walk.response_id, ReadString(value, key));
          }
        } else if (key == "choices") {
          saw_choices = true;
          return walk.Array(value, "choices", [&](size_t i, JsonValue& choice) {
            return ReadChoice(endpoint, walk, i, choice);
          });
        } else if (key == "prompt_token_ids") {
          // Chat's (and, where a build writes it, /inference/v1/generate's)
          // prompt, shared by the choices.
          if (!IsNull(value)) {
            ASSIGN_OR_RETURN(response_prompt, ReadTokenIds(value, "prompt_token_ids"));
          }
          if (walk.Added("return_token_ids")) fields.Replace("null");
        }
        return absl::OkStatus();
      }));
  if (!saw_choices) return absl::InvalidArgumentError("the response has no \"choices\"");
  const size_t count = walk.choices.size();
  for (size_t i = 0; i < count; ++i) {
    ChoiceReading& reading = walk.choices[i];
    if (reading.has_prompt) continue;
    if (response_prompt.has_value()) {
      reading.choice.prompt_ids = *response_prompt;
      reading.has_prompt = true;
    } else if (generate) {
      reading.has_prompt = walk.PromptFromRequest(i, count, reading.choice.prompt_ids);
    }
  }
  const absl::string_view prompt_field =
      endpoint == CaptureEndpoint::kVllmCompletions ? "choices[i].prompt_token_ids"
      : endpoint == CaptureEndpoint::kVllmChat      ? "prompt_token_ids"
                                                    : "the request's token_ids";
  choices = walk.FinishChoices("routed_experts", "token_ids", prompt_field);
  return absl::OkStatus();
}

}  // namespace rollpack
