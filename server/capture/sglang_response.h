// SGLang's answers to the captured endpoints (shared/spec/capture.md
// section 3.1): /generate (one item or a list of items, the routing in each
// item's meta_info), /v1/chat/completions (the routing in each choice's
// meta_info, choice 0's also in the response's sglext) and /v1/completions
// (choice 0's routing in sglext only). SGLang leaves out the fields it was
// not asked for, so what rollpackd's fields caused is removed, except the
// OpenAI choices' logprobs, which are null when not asked.
#ifndef ROLLPACK_SERVER_CAPTURE_SGLANG_RESPONSE_H_
#define ROLLPACK_SERVER_CAPTURE_SGLANG_RESPONSE_H_

#include <vector>

#include "absl/status/status.h"
#include "server/capture/engine_exchange.h"
#include "server/capture/response_walk.h"

namespace rollpack {

// Reads the response `walk` parses as `endpoint` (an SGLang one) into
// walk.response_id and `choices`, recording the client body's edits.
// INVALID_ARGUMENT naming the field when it is not that endpoint's JSON.
absl::Status ReadSglangResponse(CaptureEndpoint endpoint, ResponseWalk& walk,
                                std::vector<EngineChoice>& choices);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_SGLANG_RESPONSE_H_
