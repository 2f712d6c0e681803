// The request side of engine_exchange.h: which requests are captured, and
// the capture fields spliced into the client's JSON. The response side is
// engine_exchange_response.cc.
#include "server/capture/engine_exchange.h"

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/capture/json_splice.h"
#include "server/capture/json_values.h"
#include "simdjson.h"

namespace rollpack {
namespace {

using simdjson::ondemand::json_type;

// A field section 3.1 adds, as `"name":value`.
struct CaptureField {
  absl::string_view name;
  absl::string_view value;
};

// What each endpoint's request gets, and where. Names are the request's
// own; for vLLM /inference/v1/generate they sit in sampling_params.
struct EndpointFields {
  std::vector<CaptureField> fields;
  absl::string_view start_field;  // the routing start (section 6)
  bool in_sampling_params = false;
};

const EndpointFields& FieldsOf(CaptureEndpoint endpoint) {
  static const EndpointFields kVllmCompletions{{{"return_token_ids", "true"}, {"logprobs", "0"}},
                                               "routed_experts_prompt_start"};
  static const EndpointFields kVllmChat{
      {{"return_token_ids", "true"}, {"logprobs", "true"}, {"top_logprobs", "0"}},
      "routed_experts_prompt_start"};
  static const EndpointFields kVllmGenerate{
      {{"logprobs", "0"}}, "routed_experts_prompt_start", /*in_sampling_params=*/true};
  static const EndpointFields kSglangGenerate{
      {{"return_routed_experts", "true"}, {"return_logprob", "true"}}, "routed_experts_start_len"};
  static const EndpointFields kSglangChat{{{"return_routed_experts", "true"},
                                           {"return_meta_info", "true"},
                                           {"return_token_ids", "true"},
                                           // Its chat choices carry the prompt's
                                           // ids only when asked this way.
                                           {"return_prompt_token_ids", "true"},
                                           {"logprobs", "true"},
                                           {"top_logprobs", "0"}},
                                          "routed_experts_start_len"};
  static const EndpointFields kSglangCompletions{
      {{"return_routed_experts", "true"}, {"return_token_ids", "true"}, {"logprobs", "0"}},
      "routed_experts_start_len"};
  switch (endpoint) {
    case CaptureEndpoint::kVllmCompletions:
      return kVllmCompletions;
    case CaptureEndpoint::kVllmChat:
      return kVllmChat;
    case CaptureEndpoint::kVllmGenerate:
      return kVllmGenerate;
    case CaptureEndpoint::kSglangGenerate:
      return kSglangGenerate;
    case CaptureEndpoint::kSglangChat:
      return kSglangChat;
    case CaptureEndpoint::kSglangCompletions:
      break;
  }
  return kSglangCompletions;
}

// The capture fields of one object (the request, or its sampling_params)
// as the walk meets them: set by the client, null (replaced by ours), or
// absent (appended).
class FieldAdder {
 public:
  FieldAdder(const EndpointFields& spec, std::string prefix, int64_t start_offset)
      : spec_(spec), prefix_(std::move(prefix)), start_offset_(start_offset) {}

  // Called for each field of the object; true if `key` is a capture field.
  absl::StatusOr<bool> Visit(absl::string_view key, JsonValue& value, ObjectFields& fields,
                             ForwardedRequest& out) {
    const std::string name = absl::StrCat(prefix_, key);
    if (key == spec_.start_field) {
      seen_start_ = true;
      if (IsNull(value)) {
        if (start_offset_ > 0) {
          fields.Replace(absl::StrCat(start_offset_));
          out.added.push_back(name);
          out.start_offset = start_offset_;
        }
        return true;
      }
      ASSIGN_OR_RETURN(int64_t start, ReadInt(value, name));
      if (start < 0) return NotA(name, value, "a token offset (>= 0)");
      out.start_offset = start;  // the client's own start
      return true;
    }
    for (size_t i = 0; i < spec_.fields.size(); ++i) {
      const CaptureField& field = spec_.fields[i];
      if (key != field.name) continue;
      seen_[i] = true;
      if (IsNull(value)) {
        fields.Replace(std::string(field.value));
        out.added.push_back(name);
      }
      return true;
    }
    return false;
  }

  // Appends the fields the object lacked to `fields`.
  void AppendMissing(ObjectFields& fields, ForwardedRequest& out) {
    std::string members;
    for (size_t i = 0; i < spec_.fields.size(); ++i) {
      if (seen_[i]) continue;
      Member(members, spec_.fields[i].name, spec_.fields[i].value);
      out.added.push_back(absl::StrCat(prefix_, spec_.fields[i].name));
    }
    if (!seen_start_ && start_offset_ > 0) {
      Member(members, spec_.start_field, absl::StrCat(start_offset_));
      out.added.push_back(absl::StrCat(prefix_, spec_.start_field));
      out.start_offset = start_offset_;
    }
    if (!members.empty()) fields.Append(std::move(members));
  }

  // The object as a whole (sampling_params absent or null): `{...}`.
  std::string WholeObject(ForwardedRequest& out) {
    std::string members;
    for (const CaptureField& field : spec_.fields) {
      Member(members, field.name, field.value);
      out.added.push_back(absl::StrCat(prefix_, field.name));
    }
    if (start_offset_ > 0) {
      Member(members, spec_.start_field, absl::StrCat(start_offset_));
      out.added.push_back(absl::StrCat(prefix_, spec_.start_field));
      out.start_offset = start_offset_;
    }
    return absl::StrCat("{", members, "}");
  }

 private:
  static void Member(std::string& members, absl::string_view name, absl::string_view value) {
    absl::StrAppend(&members, members.empty() ? "" : ",", "\"", name, "\":", value);
  }

  const EndpointFields& spec_;
  const std::string prefix_;
  const int64_t start_offset_;
  std::vector<bool> seen_ = std::vector<bool>(spec_.fields.size());
  bool seen_start_ = false;
};

absl::StatusOr<int64_t> ReadN(JsonValue& value, absl::string_view what) {
  if (IsNull(value)) return 1;
  ASSIGN_OR_RETURN(int64_t n, ReadInt(value, what));
  if (n < 1) return NotA(what, value, "a positive number of choices");
  return n;
}

// A prompt as the engines take it: text, token ids, or a batch of either.
// Sets out.batch_size, and out.request_prompt_ids where it is ids.
absl::Status ReadPrompt(JsonValue& value, absl::string_view what, ForwardedRequest& out) {
  ASSIGN_OR_RETURN(json_type type, TypeOf(value, what));
  if (type == json_type::string || type == json_type::null) return absl::OkStatus();
  simdjson::ondemand::array array;
  if (type != json_type::array || value.get_array().get(array)) {
    return NotA(what, value, "text, token ids or a list of either");
  }
  std::vector<int32_t> single;
  int64_t items = 0;
  json_type kind = json_type::null;
  for (auto element : array) {
    JsonValue item;
    const std::string item_what = absl::StrCat(what, "[", items, "]");
    if (auto error = std::move(element).get(item)) return JsonError(item_what, error);
    ASSIGN_OR_RETURN(json_type item_type, TypeOf(item, item_what));
    if (items == 0) kind = item_type;
    if (item_type != kind) return NotA(item_what, item, "of the type of the list's first item");
    if (kind == json_type::number) {
      int64_t id = 0;
      if (item.get_int64().get(id) || id < 0 || id > INT32_MAX) {
        return NotA(item_what, item, "a token id");
      }
      single.push_back(static_cast<int32_t>(id));
    } else if (kind == json_type::array) {
      ASSIGN_OR_RETURN(std::vector<int32_t> ids, ReadTokenIds(item, item_what));
      out.request_prompt_ids.push_back(std::move(ids));
    } else if (kind != json_type::string) {
      return NotA(item_what, item, "text or a token id");
    }
    ++items;
  }
  if (kind == json_type::number) {
    out.request_prompt_ids.push_back(std::move(single));
  } else if (items > 0) {
    out.batch_size = items;
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view EndpointName(CaptureEndpoint endpoint) {
  switch (endpoint) {
    case CaptureEndpoint::kVllmCompletions:
      return "vllm /v1/completions";
    case CaptureEndpoint::kVllmChat:
      return "vllm /v1/chat/completions";
    case CaptureEndpoint::kVllmGenerate:
      return "vllm /inference/v1/generate";
    case CaptureEndpoint::kSglangGenerate:
      return "sglang /generate";
    case CaptureEndpoint::kSglangChat:
      return "sglang /v1/chat/completions";
    case CaptureEndpoint::kSglangCompletions:
      break;
  }
  return "sglang /v1/completions";
}

std::optional<CaptureEndpoint> CapturedEndpoint(Engine engine, absl::string_view method,
                                                absl::string_view target) {
  if (method != "POST") return std::nullopt;
  const size_t query = target.find('?');
  const absl::string_view path = target.substr(0, query);
  if (path == "/v1/completions") {
    return engine == Engine::kVllm ? CaptureEndpoint::kVllmCompletions
                                   : CaptureEndpoint::kSglangCompletions;
  }
  if (path == "/v1/chat/completions") {
    return engine == Engine::kVllm ? CaptureEndpoint::kVllmChat : CaptureEndpoint::kSglangChat;
  }
  if (engine == Engine::kVllm && path == "/inference/v1/generate") {
    return CaptureEndpoint::kVllmGenerate;
  }
  if (engine == Engine::kSglang && path == "/generate") return CaptureEndpoint::kSglangGenerate;
  return std::nullopt;
}

absl::StatusOr<ForwardedRequest> ForwardRequest(CaptureEndpoint endpoint, absl::string_view body,
                                                int64_t start_offset) {
  const EndpointFields& spec = FieldsOf(endpoint);
  const bool vllm_generate = endpoint == CaptureEndpoint::kVllmGenerate;
  const bool sglang_generate = endpoint == CaptureEndpoint::kSglangGenerate;
  // The n of /generate endpoints lives in sampling_params.
  const bool n_in_sampling_params = vllm_generate || sglang_generate;

  simdjson::padded_string padded(body.data(), body.size());
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  simdjson::ondemand::object root;
  if (auto error = parser.iterate(padded).get(doc)) return JsonError("the request", error);
  if (auto error = doc.get_object().get(root)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a JSON object (", simdjson::error_message(error), ")"));
  }
  const absl::string_view text(padded.data(), padded.size());

  ForwardedRequest out;
  int64_t n = 1;
  std::vector<JsonEdit> edits;
  FieldAdder top(spec, "", spec.in_sampling_params ? 0 : start_offset);
  FieldAdder nested(spec, "sampling_params.", start_offset);
  bool saw_sampling_params = false;
  RETURN_IF_ERROR(VisitFields(
      doc, text, root, "the request", edits,
      [&](absl::string_view key, JsonValue& value, ObjectFields& fields) -> absl::Status {
        if (!spec.in_sampling_params) {
          ASSIGN_OR_RETURN(bool capture_field, top.Visit(key, value, fields, out));
          if (capture_field) return absl::OkStatus();
        }
        if (key == "stream") {
          if (!IsNull(value)) {
            ASSIGN_OR_RETURN(out.streaming, ReadBool(value, "stream"));
          }
        } else if (key == "n" && !n_in_sampling_params) {
          ASSIGN_OR_RETURN(n, ReadN(value, "n"));
        } else if (key == "sampling_params" && n_in_sampling_params) {
          saw_sampling_params = true;
          ASSIGN_OR_RETURN(json_type type, TypeOf(value, "sampling_params"));
          if (type == json_type::null) {
            if (vllm_generate) fields.Replace(nested.WholeObject(out));
            return absl::OkStatus();
          }
          if (type == json_type::array && sglang_generate) {
            // One per prompt of a batch; SGLang takes n from the first.
            simdjson::ondemand::array list;
            if (value.get_array().get(list)) return NotA("sampling_params", value, "a list");
            for (auto element : list) {
              simdjson::ondemand::object params;
              if (element.get_object().get(params)) {
                return absl::InvalidArgumentError("sampling_params[0] is not an object");
              }
              JsonValue n_value;
              if (!params.find_field_unordered("n").get(n_value)) {
                ASSIGN_OR_RETURN(n, ReadN(n_value, "sampling_params[0].n"));
              }
              break;
            }
            return absl::OkStatus();
          }
          simdjson::ondemand::object params;
          if (type != json_type::object || value.get_object().get(params)) {
            return NotA("sampling_params", value, "an object");
          }
          return VisitFields(
              doc, text, params, "sampling_params", edits,
              [&](absl::string_view param, JsonValue& param_value,
                  ObjectFields& param_fields) -> absl::Status {
                if (param == "n") {
                  ASSIGN_OR_RETURN(n, ReadN(param_value, "sampling_params.n"));
                } else if (vllm_generate) {
                  RETURN_IF_ERROR(nested.Visit(param, param_value, param_fields, out).status());
                }
                return absl::OkStatus();
              },
              [&](ObjectFields& param_fields) {
                if (vllm_generate) nested.AppendMissing(param_fields, out);
              });
        } else if (key == "prompt" && (endpoint == CaptureEndpoint::kVllmCompletions ||
                                       endpoint == CaptureEndpoint::kSglangCompletions)) {
          RETURN_IF_ERROR(ReadPrompt(value, "prompt", out));
          // vLLM's completion response carries the prompt ids itself.
          if (endpoint == CaptureEndpoint::kVllmCompletions) out.request_prompt_ids.clear();
        } else if (key == "input_ids" &&
                   (sglang_generate || endpoint == CaptureEndpoint::kSglangChat)) {
          RETURN_IF_ERROR(ReadPrompt(value, "input_ids", out));
        } else if (key == "text" && sglang_generate) {
          RETURN_IF_ERROR(ReadPrompt(value, "text", out));
        } else if (key == "token_ids" && vllm_generate) {
          ASSIGN_OR_RETURN(std::vector<int32_t> ids, ReadTokenIds(value, "token_ids"));
          out.request_prompt_ids.push_back(std::move(ids));
        }
        return absl::OkStatus();
      },
      [&](ObjectFields& fields) {
        if (!spec.in_sampling_params) top.AppendMissing(fields, out);
        if (vllm_generate && !saw_sampling_params) {
          fields.Append(absl::StrCat("\"sampling_params\":", nested.WholeObject(out)));
        }
      }));
  if (!ParsedToEnd(doc)) {
    return absl::InvalidArgumentError("the request has content after its JSON object");
  }
  if (!out.request_prompt_ids.empty()) {
    out.batch_size = static_cast<int64_t>(out.request_prompt_ids.size());
  }
  // A sample's group_size is an int32 (n and the prompts are the client's).
  if (n > std::numeric_limits<int32_t>::max() / out.batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("n ", n, " for ", out.batch_size,
                                                   " prompts is more than 2147483647 choices"));
  }
  out.choices_asked = n * out.batch_size;
  out.body = ApplyJsonEdits(body, std::move(edits));
  return out;
}

}  // namespace rollpack
