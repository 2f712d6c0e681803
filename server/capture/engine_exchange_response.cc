// The response side of engine_exchange.h: the engine's answer read per
// engine (vllm_response.h, sglang_response.h) over a ResponseSplice.
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/capture/engine_exchange.h"
#include "server/capture/json_splice.h"
#include "server/capture/response_splice.h"
#include "server/capture/response_walk.h"
#include "server/capture/sglang_response.h"
#include "server/capture/vllm_response.h"

namespace rollpack {

absl::StatusOr<EngineResponse> ParseEngineResponse(CaptureEndpoint endpoint,
                                                   const ForwardedRequest& request,
                                                   absl::string_view body, bool keep_routing) {
  ResponseSplice splice;
  RETURN_IF_ERROR(Annotate(splice.Parse(body), EndpointName(endpoint)));
  ResponseWalk walk(request, keep_routing, splice);
  EngineResponse response;
  switch (endpoint) {
    case CaptureEndpoint::kVllmCompletions:
    case CaptureEndpoint::kVllmChat:
    case CaptureEndpoint::kVllmGenerate:
      RETURN_IF_ERROR(
          Annotate(ReadVllmResponse(endpoint, walk, response.choices), EndpointName(endpoint)));
      break;
    case CaptureEndpoint::kSglangGenerate:
    case CaptureEndpoint::kSglangChat:
    case CaptureEndpoint::kSglangCompletions:
      RETURN_IF_ERROR(
          Annotate(ReadSglangResponse(endpoint, walk, response.choices), EndpointName(endpoint)));
      break;
  }
  if (!ParsedToEnd(splice.doc())) {
    return absl::InvalidArgumentError(
        absl::StrCat(EndpointName(endpoint), ": the response has content after its JSON"));
  }
  response.response_id = std::move(walk.response_id);
  response.client_body = splice.ClientBody(&response.stripped_bytes);
  return response;
}

}  // namespace rollpack
