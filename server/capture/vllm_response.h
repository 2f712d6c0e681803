// vLLM's answers to the captured endpoints (shared/spec/capture.md section
// 3.1): /v1/completions, /v1/chat/completions and /inference/v1/generate,
// each choice with its routing as base64 .npy in choices[i].routed_experts.
// vLLM writes every field of its response models, null when not asked
// (pydantic's model_dump), so what rollpackd's fields caused is set back to
// null rather than removed.
#ifndef ROLLPACK_SERVER_CAPTURE_VLLM_RESPONSE_H_
#define ROLLPACK_SERVER_CAPTURE_VLLM_RESPONSE_H_

#include <vector>

#include "absl/status/status.h"
#include "server/capture/engine_exchange.h"
#include "server/capture/response_walk.h"

namespace rollpack {

// Reads the response `walk` parses as `endpoint` (a vLLM one) into
// walk.response_id and `choices`, recording the client body's edits.
// INVALID_ARGUMENT naming the field when it is not that endpoint's JSON.
absl::Status ReadVllmResponse(CaptureEndpoint endpoint, ResponseWalk& walk,
                              std::vector<EngineChoice>& choices);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_VLLM_RESPONSE_H_
