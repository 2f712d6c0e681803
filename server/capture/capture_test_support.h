// What the capture port's tests share (header-only, for tests only): bodies
// as ParseEngineResponse takes them, the request and response steps a test
// expects to succeed, token ids as JSON, and the MoE model the captured
// routing is for.
#ifndef ROLLPACK_SERVER_CAPTURE_CAPTURE_TEST_SUPPORT_H_
#define ROLLPACK_SERVER_CAPTURE_CAPTURE_TEST_SUPPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "scheduler/model_spec.h"
#include "server/capture/engine_exchange.h"
#include "simdjson.h"

namespace rollpack {

// A body as ParseEngineResponse takes it: followed by the parser's padding
// (NUL bytes, as the proxy's).
struct Padded {
  explicit Padded(absl::string_view json)
      : storage(absl::StrCat(json, std::string(simdjson::SIMDJSON_PADDING, '\0'))),
        view(storage.data(), json.size()) {}
  std::string storage;
  absl::string_view view;
};

// `client_body` as rollpackd forwards it to `endpoint` (ForwardRequest); a
// refusal fails the test.
inline ForwardedRequest Forwarded(CaptureEndpoint endpoint, absl::string_view client_body,
                                  int64_t start = 0) {
  absl::StatusOr<ForwardedRequest> out = ForwardRequest(endpoint, client_body, start);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *std::move(out) : ForwardedRequest();
}

// The engine's answer `body` to `request` (ParseEngineResponse); a refusal
// fails the test.
inline EngineResponse Parse(CaptureEndpoint endpoint, const ForwardedRequest& request,
                            const Padded& body, bool keep_routing = false) {
  absl::StatusOr<EngineResponse> out =
      ParseEngineResponse(endpoint, request, body.view, keep_routing);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *std::move(out) : EngineResponse();
}

// Token ids as the engines write them: [1,2,3].
inline std::string Ids(const std::vector<int>& ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ","), "]");
}

// The model "moe": `num_layers` layers, of which `moe_layers` are MoE (empty:
// all), each routing a token to `topk` of `num_experts` experts.
inline ModelSpec MoeModel(int num_layers, int num_experts, int topk,
                          std::vector<int> moe_layers = {}) {
  ModelSpec m;
  m.name = "moe";
  m.num_layers = num_layers;
  m.moe_layers = std::move(moe_layers);
  m.num_experts = num_experts;
  m.topk = topk;
  return m;
}

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_CAPTURE_TEST_SUPPORT_H_
