// SGLang's answers to the captured endpoints (shared/spec/capture.md
// section 3.1): /generate (one item or a list of items, the routing in each
// item's meta_info), /v1/chat/completions (the routing in each choice's
// meta_info, choice 0's also in the response's sglext) and /v1/completions
// (choice 0's routing in sglext only). SGLang leaves out the fields it was
// not asked for, so what rollpackd's fields caused is removed, except the
// OpenAI choices' logprobs, which are null when not asked.
#include <algorithm>
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

// The meta_info keys a request's return_logprob adds, as SGLang's tokenizer
// manager writes them (the top-k and token-id lists only with the options
// that ask for them, the flat ones with return_flat_raw_top_logprobs;
// normalized_prompt_logprob in older builds).
constexpr absl::string_view kLogprobKeys[] = {
    "input_token_logprobs",
    "output_token_logprobs",
    "output_token_logprobs_length",
    "input_top_logprobs",
    "output_top_logprobs",
    "input_token_ids_logprobs",
    "output_token_ids_logprobs",
    "normalized_prompt_logprob",
    "input_top_logprobs_val_flat",
    "input_top_logprobs_idx_flat",
    "input_top_logprobs_shape",
    "input_top_logprobs_null_prefix",
    "input_top_logprobs_val_flat_b64",
    "input_top_logprobs_idx_flat_b64",
    "input_top_logprobs_val_flat_b64_dtype",
    "input_top_logprobs_idx_flat_b64_dtype",
};

bool IsLogprobKey(absl::string_view key) {
  return std::find(std::begin(kLogprobKeys), std::end(kLogprobKeys), key) != std::end(kLogprobKeys);
}

// meta_info.output_token_logprobs: [[logprob, token id, text or null], ...].
// The logprobs go to `logprobs` and the ids to `ids` (either may be null).
absl::Status ReadTokenLogprobs(JsonValue& value, absl::string_view what,
                               std::vector<float>* logprobs, std::vector<int32_t>* ids,
                               std::string* problem) {
  simdjson::ondemand::array list;
  if (value.get_array().get(list)) return NotA(what, value, "an array");
  size_t j = 0;
  for (auto element : list) {
    simdjson::ondemand::array entry;
    if (element.get_array().get(entry)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", j, "] is not a [logprob, token id, text] list"));
    }
    size_t k = 0;
    for (auto part : entry) {
      if (k == 0 && logprobs != nullptr) {
        double logprob = 0;
        if (part.get_double().get(logprob)) {
          if (!part.is_null().value_unsafe()) {
            return absl::InvalidArgumentError(absl::StrCat(what, "[", j, "][0] is not a number"));
          }
          if (problem->empty()) *problem = absl::StrCat(what, "[", j, "][0] is null");
        }
        logprobs->push_back(static_cast<float>(logprob));
      } else if (k == 1 && ids != nullptr) {
        int64_t id = 0;
        if (part.get_int64().get(id) || id < 0 || id > INT32_MAX) {
          return absl::InvalidArgumentError(absl::StrCat(what, "[", j, "][1] is not a token id"));
        }
        ids->push_back(static_cast<int32_t>(id));
      }
      ++k;
    }
    if (k < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", j, "] is not a [logprob, token id, text] list"));
    }
    ++j;
  }
  return absl::OkStatus();
}

struct MetaInfoOptions {
  bool logprobs_added = false;  // the logprob keys go
  bool read_logprobs = false;   // output_token_logprobs are the choice's logprobs
  bool first_item = false;      // its id is the response's
};

// A /generate item's or a chat choice's meta_info. `logprob_ids`: the
// generated ids its output_token_logprobs give (chat's fallback where a
// build writes no token_ids).
absl::Status ReadMetaInfo(ResponseWalk& walk, JsonValue& value, const std::string& what,
                          ChoiceReading& reading, const MetaInfoOptions& options,
                          std::optional<std::vector<int32_t>>& logprob_ids) {
  const bool added_start = walk.Added("routed_experts_start_len");
  return walk.Object(
      value, what,
      [&](absl::string_view key, JsonValue& field_value, ObjectFields& fields) -> absl::Status {
        if (key == "id") {
          if (!IsNull(field_value)) {
            ASSIGN_OR_RETURN(reading.choice.engine_id,
                             ReadString(field_value, absl::StrCat(what, ".id")));
            if (options.first_item) walk.response_id = reading.choice.engine_id;
          }
        } else if (key == "routed_experts") {
          return walk.Routing(field_value, absl::StrCat(what, ".routed_experts"), reading, fields);
        } else if (key == "routed_experts_dtype") {
          if (!IsNull(field_value)) {
            ASSIGN_OR_RETURN(reading.choice.routing_dtype,
                             ReadString(field_value, absl::StrCat(what, ".routed_experts_dtype")));
          }
          if (!walk.keep_routing()) fields.Remove();
        } else if (key == "routed_experts_start_len") {
          if (added_start) fields.Remove();
        } else if (key == "output_token_sampling_mask") {
          // The answer to the client's own return_sampling_mask: it stays.
          RETURN_IF_ERROR(ReadSamplingMask(field_value,
                                           absl::StrCat(what, ".output_token_sampling_mask"),
                                           reading.choice.sampling_mask));
        } else if (IsLogprobKey(key)) {
          if (key == "output_token_logprobs" && !IsNull(field_value)) {
            if (options.read_logprobs) reading.choice.logprobs.clear();
            logprob_ids.emplace();
            RETURN_IF_ERROR(
                ReadTokenLogprobs(field_value, absl::StrCat(what, ".output_token_logprobs"),
                                  options.read_logprobs ? &reading.choice.logprobs : nullptr,
                                  &*logprob_ids, &reading.logprob_problem));
          }
          if (options.logprobs_added) fields.Remove();
        }
        return absl::OkStatus();
      });
}

// One /generate item: {"text", "output_ids", "meta_info", ...}.
absl::Status ReadGenerateItem(ResponseWalk& walk, simdjson::ondemand::object& item,
                              std::string where) {
  ChoiceReading& reading = walk.NewChoice(std::move(where));
  MetaInfoOptions options;
  options.logprobs_added = walk.Added("return_logprob");
  options.read_logprobs = true;
  options.first_item = walk.choices.size() == 1;
  return walk.Fields(
      item, reading.where,
      [&](absl::string_view key, JsonValue& value, ObjectFields& fields) -> absl::Status {
        if (key == "output_ids" || key == "prompt_token_ids") {
          const bool generated = key == "output_ids";
          if (IsNull(value)) return absl::OkStatus();
          ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                           ReadTokenIds(value, absl::StrCat(reading.where, ".", key)));
          (generated ? reading.choice.generated_ids : reading.choice.prompt_ids) = std::move(ids);
          (generated ? reading.has_generated : reading.has_prompt) = true;
        } else if (key == "meta_info") {
          std::optional<std::vector<int32_t>> logprob_ids;
          return ReadMetaInfo(walk, value, absl::StrCat(reading.where, ".meta_info"), reading,
                              options, logprob_ids);
        }
        return absl::OkStatus();
      });
}

absl::Status ReadGenerate(ResponseWalk& walk) {
  simdjson::ondemand::json_type type;
  if (auto error = walk.splice().doc().type().get(type)) return JsonError("the response", error);
  if (type == simdjson::ondemand::json_type::object) {
    simdjson::ondemand::object item;
    if (auto error = walk.splice().doc().get_object().get(item)) {
      return JsonError("the response", error);
    }
    return ReadGenerateItem(walk, item, "the response");
  }
  simdjson::ondemand::array items;
  if (type != simdjson::ondemand::json_type::array || walk.splice().doc().get_array().get(items)) {
    return absl::InvalidArgumentError("the response is not a JSON object or array");
  }
  size_t i = 0;
  for (auto element : items) {
    simdjson::ondemand::object item;
    if (auto error = element.get_object().get(item)) {
      return JsonError(absl::StrCat("the response's item ", i), error);
    }
    RETURN_IF_ERROR(ReadGenerateItem(walk, item, absl::StrCat("[", i, "]")));
    ++i;
  }
  return absl::OkStatus();
}

// What the OpenAI endpoints' response level holds for the choices.
struct ResponseLevel {
  ChoiceReading sglext;  // sglext.routed_experts: choice 0's routing
  std::optional<std::vector<int32_t>> prompt;
  bool saw_choices = false;
};

// An sglext object: the response's (choice 0's routing), or a choice's in
// builds that put it there (the Python adapter reads a choice's "sgl_ext").
// Its routed_experts is routing; an sglext left empty goes as a whole.
absl::Status ReadSglext(ResponseWalk& walk, JsonValue& value, absl::string_view what,
                        ChoiceReading& reading, ObjectFields& parent_fields) {
  if (IsNull(value)) return absl::OkStatus();
  size_t kept = 0, removed = 0;
  RETURN_IF_ERROR(walk.Object(
      value, what,
      [&](absl::string_view key, JsonValue& field_value, ObjectFields& fields) -> absl::Status {
        if (key != "routed_experts") {
          ++kept;
          return absl::OkStatus();
        }
        ++(walk.keep_routing() ? kept : removed);
        return walk.Routing(field_value, absl::StrCat(what, ".routed_experts"), reading, fields);
      }));
  // Left empty here, not as the engine wrote it ({}: every byte stays).
  if (kept == 0 && removed > 0) parent_fields.Remove();
  return absl::OkStatus();
}

absl::Status ReadOpenAiChoice(CaptureEndpoint endpoint, ResponseWalk& walk, size_t index,
                              JsonValue& value,
                              std::vector<std::optional<std::vector<int32_t>>>& logprob_ids) {
  const bool chat = endpoint == CaptureEndpoint::kSglangChat;
  ChoiceReading& reading = walk.NewChoice(absl::StrCat("choices[", index, "]"));
  logprob_ids.emplace_back();
  std::optional<std::vector<int32_t>>& ids_from_logprobs = logprob_ids.back();
  const std::string& where = reading.where;
  const bool added_token_ids = walk.Added("return_token_ids");
  const bool added_logprobs = walk.Added("logprobs");
  return walk.Object(
      value, where,
      [&](absl::string_view key, JsonValue& field_value, ObjectFields& fields) -> absl::Status {
        if (key == "token_ids" || key == "prompt_token_ids") {
          RETURN_IF_ERROR(ReadChoiceTokenIds(key, field_value, reading));
          const bool generated = key == "token_ids";
          // Chat's prompt_token_ids answer return_prompt_token_ids.
          const bool caused_by_us =
              generated || !chat ? added_token_ids : walk.Added("return_prompt_token_ids");
          if (caused_by_us) fields.Remove();
        } else if (key == "logprobs") {
          const std::string what = absl::StrCat(where, ".logprobs");
          RETURN_IF_ERROR(chat ? ReadChatLogprobs(field_value, what, reading)
                               : ReadCompletionLogprobs(field_value, what, reading));
          if (added_logprobs) fields.Replace("null");
        } else if (key == "meta_info" && chat) {
          MetaInfoOptions options;
          options.logprobs_added = added_logprobs;
          RETURN_IF_ERROR(ReadMetaInfo(walk, field_value, absl::StrCat(where, ".meta_info"),
                                       reading, options, ids_from_logprobs));
          // With keep_routing the meta_info stays: it holds the routing.
          if (walk.Added("return_meta_info") && !walk.keep_routing()) fields.Remove();
        } else if (key == "sglext" || key == "sgl_ext") {
          return ReadSglext(walk, field_value, absl::StrCat(where, ".", key), reading, fields);
        }
        return absl::OkStatus();
      });
}

absl::Status ReadOpenAi(CaptureEndpoint endpoint, ResponseWalk& walk, ResponseLevel& level,
                        std::vector<std::optional<std::vector<int32_t>>>& logprob_ids) {
  return walk.Root(
      [&](absl::string_view key, JsonValue& value, ObjectFields& fields) -> absl::Status {
        if (key == "id") {
          if (!IsNull(value)) {
            ASSIGN_OR_RETURN(walk.response_id, ReadString(value, "id"));
          }
        } else if (key == "choices") {
          level.saw_choices = true;
          return walk.Array(value, "choices", [&](size_t i, JsonValue& choice) {
            return ReadOpenAiChoice(endpoint, walk, i, choice, logprob_ids);
          });
        } else if (key == "prompt_token_ids") {
          if (!IsNull(value)) {
            ASSIGN_OR_RETURN(level.prompt, ReadTokenIds(value, "prompt_token_ids"));
          }
        } else if (key == "sglext") {
          return ReadSglext(walk, value, "sglext", level.sglext, fields);
        }
        return absl::OkStatus();
      });
}

}  // namespace

absl::Status ReadSglangResponse(CaptureEndpoint endpoint, ResponseWalk& walk,
                                std::vector<EngineChoice>& choices) {
  if (endpoint == CaptureEndpoint::kSglangGenerate) {
    RETURN_IF_ERROR(ReadGenerate(walk));
    const size_t count = walk.choices.size();
    for (size_t i = 0; i < count; ++i) {
      ChoiceReading& reading = walk.choices[i];
      if (!reading.has_prompt) {
        reading.has_prompt = walk.PromptFromRequest(i, count, reading.choice.prompt_ids);
      }
    }
    choices =
        walk.FinishChoices("meta_info.routed_experts", "output_ids", "the request's input_ids");
    return absl::OkStatus();
  }

  ResponseLevel level;
  std::vector<std::optional<std::vector<int32_t>>> logprob_ids;
  RETURN_IF_ERROR(ReadOpenAi(endpoint, walk, level, logprob_ids));
  if (!level.saw_choices) return absl::InvalidArgumentError("the response has no \"choices\"");
  const bool chat = endpoint == CaptureEndpoint::kSglangChat;
  const size_t count = walk.choices.size();
  for (size_t i = 0; i < count; ++i) {
    ChoiceReading& reading = walk.choices[i];
    if (!reading.has_prompt && level.prompt.has_value()) {
      reading.choice.prompt_ids = *level.prompt;
      reading.has_prompt = true;
    }
    if (!reading.has_prompt) {
      reading.has_prompt = walk.PromptFromRequest(i, count, reading.choice.prompt_ids);
    }
    if (chat && !reading.has_generated && logprob_ids[i].has_value()) {
      reading.choice.generated_ids = *logprob_ids[i];
      reading.has_generated = true;
    }
    if (reading.has_routing) continue;
    if (i == 0 && level.sglext.has_routing) {
      reading.choice.routing_base64 = level.sglext.choice.routing_base64;
      reading.has_routing = true;
    } else if (!chat && i > 0) {
      reading.choice.unusable = absl::FailedPreconditionError(absl::StrCat(
          reading.where, ": SGLang /v1/completions returns the routing of choice 0 only"));
    } else if (i == 0 && reading.routing_problem.empty()) {
      reading.routing_problem = level.sglext.routing_problem;
    }
  }
  choices = chat ? walk.FinishChoices("meta_info.routed_experts", "token_ids",
                                      "prompt_token_ids or the request's input_ids")
                 : walk.FinishChoices("sglext.routed_experts", "token_ids",
                                      "prompt_token_ids or the request's prompt as ids");
  return absl::OkStatus();
}

}  // namespace rollpack
