// The response side of engine_exchange.h: the engine's answer read per
// engine (vllm_response.cc, sglang_response.cc) over a ResponseSplice.
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/capture/engine_exchange.h"
#include "server/capture/json_splice.h"
#include "server/capture/response_splice.h"
#include "server/capture/response_walk.h"

namespace rollpack {
namespace {

using ResponseReader = absl::Status (*)(CaptureEndpoint endpoint, ResponseWalk& walk,
                                        std::vector<EngineChoice>& choices);

// The reader of `endpoint`'s engine (response_walk.h).
ResponseReader ReaderOf(CaptureEndpoint endpoint) {
  switch (endpoint) {
    case CaptureEndpoint::kVllmCompletions:
    case CaptureEndpoint::kVllmChat:
    case CaptureEndpoint::kVllmGenerate:
      return ReadVllmResponse;
    case CaptureEndpoint::kSglangGenerate:
    case CaptureEndpoint::kSglangChat:
    case CaptureEndpoint::kSglangCompletions:
      break;
  }
  return ReadSglangResponse;
}

}  // namespace

absl::StatusOr<EngineResponse> ParseEngineResponse(CaptureEndpoint endpoint,
                                                   const ForwardedRequest& request,
                                                   absl::string_view body, bool keep_routing) {
  ResponseSplice splice;
  RETURN_IF_ERROR(Annotate(splice.Parse(body), EndpointName(endpoint)));
  ResponseWalk walk(request, keep_routing, splice);
  EngineResponse response;
  RETURN_IF_ERROR(
      Annotate(ReaderOf(endpoint)(endpoint, walk, response.choices), EndpointName(endpoint)));
  if (!ParsedToEnd(splice.doc())) {
    return absl::InvalidArgumentError(
        absl::StrCat(EndpointName(endpoint), ": the response has content after its JSON"));
  }
  response.response_id = std::move(walk.response_id);
  response.client_body = splice.ClientBody(&response.stripped_bytes);
  return response;
}

}  // namespace rollpack
