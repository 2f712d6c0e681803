#include "server/capture/rollpack_endpoints.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

std::string Refusal(const std::string& body) {
  absl::StatusOr<v1::AnnotateSamplesRequest> request =
      ParseAnnotateBody(body, CaptureHeaders(), "default");
  EXPECT_FALSE(request.ok()) << body;
  EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument) << body;
  return std::string(request.status().message());
}

TEST(ParseAnnotateBodyTest, ReadsTheRequestAndPicksThePool) {
  absl::StatusOr<v1::AnnotateSamplesRequest> request = ParseAnnotateBody(
      R"({"annotations": [{"sample_id": "a", "scalars": {"reward": 0.5, "len": 3}},
                          {"sample_id": "b#1", "scalars": {}}, {"sample_id": "c"}]})",
      CaptureHeaders(), "default");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->pool(), "default");
  ASSERT_EQ(request->annotations_size(), 3);
  EXPECT_EQ(request->annotations(0).sample_id(), "a");
  EXPECT_EQ(request->annotations(0).scalars().at("reward"), 0.5);
  EXPECT_EQ(request->annotations(0).scalars().at("len"), 3.0);
  EXPECT_EQ(request->annotations(1).sample_id(), "b#1");
  EXPECT_TRUE(request->annotations(1).scalars().empty());
  EXPECT_TRUE(request->annotations(2).scalars().empty());

  CaptureHeaders headers;
  headers.pool = "from-header";
  request = ParseAnnotateBody(R"({"annotations": []})", headers, "default");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->pool(), "from-header");
  request = ParseAnnotateBody(R"({"pool": "from-body", "annotations": []})", headers, "default");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->pool(), "from-body");
}

TEST(ParseAnnotateBodyTest, NamesWhatIsMalformed) {
  EXPECT_THAT(Refusal(""), HasSubstr("not JSON"));
  EXPECT_THAT(Refusal("[1]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(Refusal("{}"), HasSubstr("no \"annotations\""));
  EXPECT_THAT(Refusal(R"({"annotation": []})"), HasSubstr("unknown member \"annotation\""));
  EXPECT_THAT(Refusal(R"({"pool": "", "annotations": []})"), HasSubstr("\"pool\""));
  EXPECT_THAT(Refusal(R"({"annotations": {}})"), HasSubstr("not a JSON array"));
  EXPECT_THAT(Refusal(R"({"annotations": [3]})"), HasSubstr("\"annotations\"[0] is not"));
  EXPECT_THAT(Refusal(R"({"annotations": [{"scalars": {}}]})"),
              HasSubstr("\"annotations\"[0] has no sample_id"));
  EXPECT_THAT(Refusal(R"({"annotations": [{"sample_id": "a"}, {"sample_id": 7}]})"),
              HasSubstr("\"annotations\"[1].sample_id"));
  EXPECT_THAT(Refusal(R"({"annotations": [{"sample_id": "a", "reward": 1}]})"),
              HasSubstr("unknown member \"reward\""));
  EXPECT_THAT(Refusal(R"({"annotations": [{"sample_id": "a", "scalars": {"reward": "1"}}]})"),
              HasSubstr("\"reward\" is not a finite number"));
  EXPECT_THAT(Refusal(R"({"annotations": [{"sample_id": "a", "scalars": [1]}]})"),
              HasSubstr("not a JSON object"));
}

TEST(ServeRollpackEndpointTest, AnnotateAnswersAsTheRpcDoes) {
  CaptureRecorder recorder(nullptr, nullptr, Engine::kVllm, "default", false);
  v1::AnnotateSamplesRequest seen;
  absl::Status next_status;
  AnnotateFunction annotate = [&](const v1::AnnotateSamplesRequest& request)
      -> absl::StatusOr<v1::AnnotateSamplesResponse> {
    seen = request;
    if (!next_status.ok()) return next_status;
    v1::AnnotateSamplesResponse response;
    response.set_annotated(request.annotations_size());
    return response;
  };
  const std::string body = R"({"annotations": [{"sample_id": "a", "scalars": {"reward": 1}}]})";
  EndpointReply reply = ServeRollpackEndpoint(recorder, annotate, "POST",
                                              "/rollpack/v1/annotate?x=1", body, CaptureHeaders());
  ASSERT_TRUE(reply.status.ok()) << reply.status;
  EXPECT_EQ(reply.body, R"({"annotated": 1})");
  EXPECT_EQ(seen.pool(), "default");
  EXPECT_EQ(seen.annotations(0).sample_id(), "a");

  next_status = absl::FailedPreconditionError("sample a is in step s");
  reply = ServeRollpackEndpoint(recorder, annotate, "POST", "/rollpack/v1/annotate", body,
                                CaptureHeaders());
  EXPECT_EQ(reply.status, next_status);
  EXPECT_EQ(reply.error_type, "rollpack_annotate");

  reply = ServeRollpackEndpoint(recorder, annotate, "GET", "/rollpack/v1/annotate", "",
                                CaptureHeaders());
  EXPECT_EQ(reply.status.code(), absl::StatusCode::kNotFound);
  reply = ServeRollpackEndpoint(recorder, {}, "POST", "/rollpack/v1/annotate", body,
                                CaptureHeaders());
  EXPECT_EQ(reply.status.code(), absl::StatusCode::kUnimplemented);
  reply = ServeRollpackEndpoint(recorder, annotate, "POST", "/rollpack/v1/annotate", "{",
                                CaptureHeaders());
  EXPECT_EQ(reply.status.code(), absl::StatusCode::kInvalidArgument);
  reply = ServeRollpackEndpoint(recorder, annotate, "POST", "/rollpack/v1/other", "",
                                CaptureHeaders());
  EXPECT_EQ(reply.status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(reply.status.message(), HasSubstr("POST /rollpack/v1/annotate"));
}

}  // namespace
}  // namespace rollpack
