#include "server/capture/capture_headers.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<CaptureHeaders> Parse(std::vector<HeaderField> fields) {
  return ParseCaptureHeaders(fields);
}

std::string Refusal(std::vector<HeaderField> fields) {
  absl::StatusOr<CaptureHeaders> headers = Parse(std::move(fields));
  EXPECT_FALSE(headers.ok());
  EXPECT_EQ(headers.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(headers.status().message());
}

TEST(CaptureHeadersTest, ReadsEveryHeaderCaseInsensitively) {
  absl::StatusOr<CaptureHeaders> h =
      Parse({{"x-rollpack-pool", "grpo"},
             {"X-Rollpack-Sample-Id", "req-7"},
             {"X-ROLLPACK-GROUP-ID", "prompt-3"},
             {"X-Rollpack-Group-Size", "16"},
             {"X-Rollpack-Policy-Version", "-4"},
             {"X-Rollpack-Session", "agent-1"},
             {"X-Rollpack-Final", "true"},
             {"X-Rollpack-Scalars", R"({"reward": 0.5, "len": 3})"},
             {"X-Rollpack-Token", " tok "},
             {"Authorization", "Bearer engine-key"}});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h->pool, "grpo");
  EXPECT_EQ(*h->sample_id, "req-7");
  EXPECT_EQ(*h->group_id, "prompt-3");
  EXPECT_EQ(*h->group_size, 16);
  EXPECT_EQ(h->policy_version, -4);
  EXPECT_EQ(*h->session, "agent-1");
  EXPECT_TRUE(h->final_turn);
  EXPECT_EQ(h->scalars->at("reward"), 0.5);
  EXPECT_EQ(h->scalars->at("len"), 3.0);
  EXPECT_EQ(*h->token, "tok");
}

TEST(CaptureHeadersTest, AbsentHeadersTakeTheirDefaults) {
  absl::StatusOr<CaptureHeaders> h = Parse({{"Content-Type", "application/json"}});
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->pool.has_value());
  EXPECT_FALSE(h->sample_id.has_value());
  EXPECT_FALSE(h->group_size.has_value());
  EXPECT_EQ(h->policy_version, 0);
  EXPECT_FALSE(h->final_turn);
  EXPECT_FALSE(h->scalars.has_value());
  // A newer client's header an older rollpackd does not know is ignored.
  EXPECT_TRUE(Parse({{"X-Rollpack-Future-Thing", "1"}}).ok());
}

TEST(CaptureHeadersTest, MalformedValuesAreRefusedNamingTheHeader) {
  EXPECT_THAT(Refusal({{"X-Rollpack-Policy-Version", "1.5"}}),
              HasSubstr("X-Rollpack-Policy-Version: \"1.5\" is not a decimal int64"));
  EXPECT_THAT(Refusal({{"X-Rollpack-Policy-Version", "99999999999999999999"}}),
              HasSubstr("not a decimal int64"));
  EXPECT_THAT(Refusal({{"X-Rollpack-Group-Size", "-1"}}), HasSubstr("Group-Size"));
  EXPECT_THAT(Refusal({{"X-Rollpack-Group-Size", "4294967296"}}), HasSubstr("Group-Size"));
  EXPECT_THAT(Refusal({{"X-Rollpack-Group-Size", "8x"}}), HasSubstr("Group-Size"));
  EXPECT_THAT(Refusal({{"X-Rollpack-Final", "yes"}}),
              HasSubstr("X-Rollpack-Final: \"yes\" is neither true nor false"));
  EXPECT_THAT(Refusal({{"X-Rollpack-Scalars", "[1]"}}), HasSubstr("not a JSON object"));
  EXPECT_THAT(Refusal({{"X-Rollpack-Scalars", R"({"reward": "high"})"}}),
              HasSubstr("\"reward\" is not a finite number"));
  EXPECT_THAT(Refusal({{"X-Rollpack-Scalars", R"({"reward": 1e999})"}}),
              HasSubstr("X-Rollpack-Scalars"));
  EXPECT_THAT(Refusal({{"X-Rollpack-Scalars", "{"}}), HasSubstr("is not JSON"));
  for (const char* header :
       {"X-Rollpack-Pool", "X-Rollpack-Sample-Id", "X-Rollpack-Group-Id", "X-Rollpack-Session"}) {
    EXPECT_THAT(Refusal({{header, ""}}), HasSubstr("is empty")) << header;
  }
  EXPECT_THAT(Refusal({{"X-Rollpack-Pool", "a"}, {"x-rollpack-pool", "b"}}),
              HasSubstr("given twice"));
}

TEST(CaptureHeadersTest, OnlyRollpackHeadersAreRemovedBeforeForwarding) {
  EXPECT_TRUE(IsCaptureHeader("X-Rollpack-Token"));
  EXPECT_TRUE(IsCaptureHeader("x-rollpack-anything"));
  EXPECT_FALSE(IsCaptureHeader("Authorization"));
  EXPECT_FALSE(IsCaptureHeader("X-Rollpack"));
  EXPECT_FALSE(IsCaptureHeader("X-Request-Id"));
}

}  // namespace
}  // namespace rollpack
