// What the capture port adds to a generation request and takes out of the
// engine's answer (shared/spec/capture.md sections 3 and 4), per engine and
// endpoint: the only file that knows the engines' JSON field names. The
// proxy (capture_server.h) moves bytes; the store sees ordinary samples
// (captured_sample.h).
#ifndef ROLLPACK_SERVER_CAPTURE_ENGINE_EXCHANGE_H_
#define ROLLPACK_SERVER_CAPTURE_ENGINE_EXCHANGE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rollpack {

enum class Engine { kVllm, kSglang };

// The captured endpoints of capture.md section 3.1.
enum class CaptureEndpoint {
  kVllmCompletions,    // POST /v1/completions
  kVllmChat,           // POST /v1/chat/completions
  kVllmGenerate,       // POST /inference/v1/generate
  kSglangGenerate,     // POST /generate
  kSglangChat,         // POST /v1/chat/completions
  kSglangCompletions,  // POST /v1/completions
};

// "vllm /v1/chat/completions"-like name for logs and the metric label.
absl::string_view EndpointName(CaptureEndpoint endpoint);

// The captured endpoint `method` `target` is on `engine`, or nullopt (the
// request is passed through unchanged). `target` may carry a query string.
std::optional<CaptureEndpoint> CapturedEndpoint(Engine engine, absl::string_view method,
                                                absl::string_view target);

// The request as forwarded, and what the response parser needs to undo it.
struct ForwardedRequest {
  std::string body;  // the client's JSON with the capture fields it lacked
  // Fields rollpackd added (each also in `body`), named by their path in the
  // request, from which the parser knows what to take back out (section 4):
  //   "return_token_ids"   vLLM: prompt_token_ids and token_ids set back to
  //                        null; SGLang: choices[i].token_ids removed (and
  //                        on /v1/completions choices[i].prompt_token_ids)
  //   "logprobs"           choices[i].logprobs set back to null (and on SGLang
  //                        chat the logprob keys of a meta_info the client
  //                        asked for removed)
  //   "top_logprobs"       nothing (0 is both engines' default)
  //   "sampling_params.logprobs"  vLLM /inference/v1/generate:
  //                        choices[i].logprobs set back to null
  //   "return_logprob"     SGLang /generate: meta_info's logprob keys removed
  //   "return_meta_info"   SGLang chat: choices[i].meta_info removed (kept
  //                        whole with keep_routing: it holds the routing)
  //   "return_routed_experts"  nothing beyond the routing payload itself
  //   "routed_experts_prompt_start", "sampling_params.routed_experts_prompt_start",
  //   "routed_experts_start_len"  the start echoed back, where an engine
  //                        echoes it, removed
  std::vector<std::string> added;
  bool streaming = false;  // "stream": true
  // Choices asked for: n (vLLM /inference/v1/generate and SGLang /generate:
  // sampling_params.n) times the prompts in the request.
  int64_t choices_asked = 1;
  // Prompts in the request: above 1 for a batch (a list of prompts, as text
  // or as ids), whose choices are not one prompt's group.
  int64_t batch_size = 1;
  // Prompt ids read from the request where the response lacks them
  // (SGLang /generate and chat input_ids, vLLM /inference/v1/generate
  // token_ids, SGLang /v1/completions prompt as ids); one list per batch
  // item, empty when the request gives text.
  std::vector<std::vector<int32_t>> request_prompt_ids;
  // The routing start asked for (0: none): the argument of ForwardRequest,
  // or the client's own value when it set the engine's start field itself.
  int64_t start_offset = 0;
};

// `body` with the capture fields of section 3.1 the client did not set,
// and the start offset (section 6) when `start_offset` > 0, spliced in
// before the object's closing brace (or into sampling_params) so that every
// byte the client wrote stays. A field set to null counts as not set (the
// engines read null as their default): its value is replaced. INVALID_ARGUMENT
// naming the field and its value when `body` is not a JSON object the endpoint
// takes (a stream that is not a boolean, an n below 1, prompt ids that are not
// token ids, ...): the caller then forwards the client's bytes unchanged, not
// captured.
absl::StatusOr<ForwardedRequest> ForwardRequest(CaptureEndpoint endpoint, absl::string_view body,
                                                int64_t start_offset);

// The token ids the engine's sampler kept at each generated position (its
// sampling mask), flattened: list j is ids[offsets[j], offsets[j + 1]).
struct SamplingMaskLists {
  std::vector<int32_t> ids;
  std::vector<int64_t> offsets;  // empty: the engine returned no mask

  bool present() const { return !offsets.empty(); }
  int64_t lists() const { return present() ? static_cast<int64_t>(offsets.size()) - 1 : 0; }
};

// One returned choice, as section 3.1 reads it.
struct EngineChoice {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> generated_ids;
  std::vector<float> logprobs;  // one per generated id; empty: none returned
  // The routing payload: base64 text as the engine wrote it (a view into
  // the response body given to ParseEngineResponse), empty when absent or
  // null. vLLM: a .npy file; SGLang: raw values of `routing_dtype`.
  absl::string_view routing_base64;
  std::string routing_dtype;  // SGLang's routed_experts_dtype; "" = absent
  std::string engine_id;      // the choice's id where the engine gives one
  // vLLM choices[i].sampling_mask, SGLang meta_info.output_token_sampling_mask:
  // one list per generated id when the engine returned it.
  SamplingMaskLists sampling_mask;
  // Why this choice cannot be stored (no routing, no token ids, ...), or OK.
  absl::Status unusable;
};

struct EngineResponse {
  std::vector<EngineChoice> choices;  // in the order the engine returned them
  std::string response_id;            // section 2's default base id B
  // The client's body (section 4): the engine's bytes with the routing
  // payload and what the added fields caused removed, every other byte kept.
  std::string client_body;
  // Routing payload bytes removed: the base64 text of the routing strings
  // the client's body lost (SGLang chat writes choice 0's twice).
  int64_t stripped_bytes = 0;
};

// Parses the engine's non-streaming 2xx answer to `request`. `body` must be
// followed by simdjson::SIMDJSON_PADDING readable bytes and outlive the
// result (the routing views point into it). With `keep_routing` the routing
// payload stays in the client's body. A choice without routing, token ids
// or prompt ids is returned with `unusable` naming the field; INVALID_ARGUMENT
// naming the field when the body is not the endpoint's JSON (then nothing is
// stored and the client gets `body`).
absl::StatusOr<EngineResponse> ParseEngineResponse(CaptureEndpoint endpoint,
                                                   const ForwardedRequest& request,
                                                   absl::string_view body, bool keep_routing);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_ENGINE_EXCHANGE_H_
