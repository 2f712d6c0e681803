#include "server/capture/response_walk.h"

#include <algorithm>

#include "base/status_macros.h"

namespace rollpack {
namespace {

using simdjson::ondemand::json_type;

// Logprob j of the list `list` (`suffix`: its field inside the entry), as
// the engines write it: a number, or null where they have none (a prompt
// token; never a sampled one unless something went wrong). Names are built
// only for a message: a choice has thousands.
absl::Status AppendLogprob(JsonValue& value, absl::string_view list, size_t j,
                           absl::string_view suffix, ChoiceReading& reading) {
  double logprob = 0;
  if (!value.get_double().get(logprob)) {
    reading.choice.logprobs.push_back(static_cast<float>(logprob));
    return absl::OkStatus();
  }
  const std::string what = absl::StrCat(list, "[", j, "]", suffix);
  if (!IsNull(value)) return NotA(what, value, "a number");
  if (reading.logprob_problem.empty()) reading.logprob_problem = absl::StrCat(what, " is null");
  reading.choice.logprobs.push_back(0.0f);
  return absl::OkStatus();
}

}  // namespace

bool ResponseWalk::Added(absl::string_view field) const {
  return std::find(request_.added.begin(), request_.added.end(), field) != request_.added.end();
}

ChoiceReading& ResponseWalk::NewChoice(std::string where) {
  choices.emplace_back();
  choices.back().where = std::move(where);
  return choices.back();
}

absl::Status ResponseWalk::Routing(JsonValue& value, absl::string_view what, ChoiceReading& reading,
                                   ObjectFields& fields) {
  if (!keep_routing_) fields.Remove();
  ASSIGN_OR_RETURN(json_type type, TypeOf(value, what));
  switch (type) {
    case json_type::string:
      reading.choice.routing_base64 = splice_.StringInBody(AbslView(value.raw_json_token()));
      reading.has_routing = !reading.choice.routing_base64.empty();
      if (!reading.has_routing) reading.routing_problem = absl::StrCat(what, " is empty");
      break;
    case json_type::null:
      reading.routing_problem =
          absl::StrCat(what,
                       " is null (an engine started without routing capture, or a "
                       "request aborted before its first forward pass)");
      break;
    default:
      reading.routing_problem = absl::StrCat(what, " is ", Quote(value), ", not base64 text");
      break;
  }
  return absl::OkStatus();
}

bool ResponseWalk::PromptFromRequest(size_t index, size_t count, std::vector<int32_t>& out) const {
  const auto& prompts = request_.request_prompt_ids;
  if (prompts.empty() || count == 0) return false;
  if (prompts.size() == 1) {
    out = prompts[0];
    return true;
  }
  if (count % prompts.size() != 0) return false;
  out = prompts[index / (count / prompts.size())];
  return true;
}

std::vector<EngineChoice> ResponseWalk::FinishChoices(absl::string_view routing_field,
                                                      absl::string_view generated_field,
                                                      absl::string_view prompt_field) {
  std::vector<EngineChoice> out;
  out.reserve(choices.size());
  for (ChoiceReading& reading : choices) {
    EngineChoice& choice = reading.choice;
    if (choice.unusable.ok() && !reading.has_routing) {
      choice.unusable = absl::FailedPreconditionError(
          !reading.routing_problem.empty()
              ? reading.routing_problem
              : absl::StrCat(reading.where, ": no ", routing_field, " in the response"));
    }
    if (choice.unusable.ok() && !reading.has_generated) {
      choice.unusable = absl::FailedPreconditionError(
          absl::StrCat(reading.where, ": no generated token ids (", generated_field, ")"));
    }
    if (choice.unusable.ok() && !reading.has_prompt) {
      choice.unusable = absl::FailedPreconditionError(
          absl::StrCat(reading.where, ": no prompt token ids (", prompt_field, ")"));
    }
    if (choice.unusable.ok() && !reading.logprob_problem.empty()) {
      choice.unusable = absl::FailedPreconditionError(reading.logprob_problem);
    }
    out.push_back(std::move(choice));
  }
  return out;
}

absl::Status ReadChatLogprobs(JsonValue& value, absl::string_view what, ChoiceReading& reading) {
  reading.choice.logprobs.clear();
  if (IsNull(value)) return absl::OkStatus();
  simdjson::ondemand::object object;
  if (value.get_object().get(object)) return NotA(what, value, "an object or null");
  JsonValue content;
  if (auto error = object.find_field_unordered("content").get(content)) {
    if (error == simdjson::NO_SUCH_FIELD) return absl::OkStatus();
    return JsonError(what, error);
  }
  if (IsNull(content)) return absl::OkStatus();
  const std::string content_what = absl::StrCat(what, ".content");
  simdjson::ondemand::array array;
  if (content.get_array().get(array)) return NotA(content_what, content, "an array or null");
  size_t j = 0;
  for (auto element : array) {
    simdjson::ondemand::object entry;
    JsonValue logprob;
    if (auto error = element.get_object().get(entry)) {
      return JsonError(absl::StrCat(content_what, "[", j, "]"), error);
    }
    if (auto error = entry.find_field_unordered("logprob").get(logprob)) {
      return JsonError(absl::StrCat(content_what, "[", j, "].logprob"), error);
    }
    RETURN_IF_ERROR(AppendLogprob(logprob, content_what, j, ".logprob", reading));
    ++j;
  }
  return absl::OkStatus();
}

absl::Status ReadCompletionLogprobs(JsonValue& value, absl::string_view what,
                                    ChoiceReading& reading) {
  reading.choice.logprobs.clear();
  if (IsNull(value)) return absl::OkStatus();
  simdjson::ondemand::object object;
  if (value.get_object().get(object)) return NotA(what, value, "an object or null");
  JsonValue list;
  if (auto error = object.find_field_unordered("token_logprobs").get(list)) {
    if (error == simdjson::NO_SUCH_FIELD) return absl::OkStatus();
    return JsonError(what, error);
  }
  const std::string list_what = absl::StrCat(what, ".token_logprobs");
  simdjson::ondemand::array array;
  if (list.get_array().get(array)) return NotA(list_what, list, "an array");
  size_t j = 0;
  for (auto element : array) {
    JsonValue logprob;
    if (auto error = std::move(element).get(logprob)) {
      return JsonError(absl::StrCat(list_what, "[", j, "]"), error);
    }
    RETURN_IF_ERROR(AppendLogprob(logprob, list_what, j, "", reading));
    ++j;
  }
  return absl::OkStatus();
}

absl::Status ReadChoiceTokenIds(absl::string_view key, JsonValue& value, ChoiceReading& reading) {
  if (IsNull(value)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                   ReadTokenIds(value, absl::StrCat(reading.where, ".", key)));
  const bool generated = key == "token_ids";
  (generated ? reading.choice.generated_ids : reading.choice.prompt_ids) = std::move(ids);
  (generated ? reading.has_generated : reading.has_prompt) = true;
  return absl::OkStatus();
}

}  // namespace rollpack
