// The resume backoff's schedule (bounded, capped, reproducible, spread over
// ranks) and the resume index a failed stream's status carries. The restart
// itself is tests/trainer_restart_test.cc.
#include "client/cpp/stream_resume.h"

#include <set>
#include <string>

#include "absl/strings/cord.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ResumeDelayTest, DoublesFromInitialUpToTheCapWithBoundedJitter) {
  const ResumeBackoff b{absl::Milliseconds(100), absl::Seconds(2)};
  absl::Duration nominal = b.initial;
  for (int attempt = 0; attempt < 40; ++attempt) {
    const absl::Duration d = ResumeDelay(b, attempt, 42);
    EXPECT_GE(d, nominal * 0.75) << "attempt " << attempt;
    EXPECT_LE(d, nominal) << "attempt " << attempt;
    EXPECT_LE(d, b.max) << "attempt " << attempt;
    nominal = std::min(nominal * 2, b.max);
  }
  // After five doublings the cap holds: 100 ms * 2^5 = 3.2 s > 2 s.
  EXPECT_GE(ResumeDelay(b, 5, 42), absl::Milliseconds(1500));
  // A huge attempt count neither overflows nor exceeds the cap.
  EXPECT_LE(ResumeDelay(b, 1 << 30, 42), b.max);
  EXPECT_GE(ResumeDelay(b, 1 << 30, 42), b.max * 0.75);
}

TEST(ResumeDelayTest, SameSeedSameScheduleOtherRanksSpread) {
  const ResumeBackoff b;
  v1::RankCoords r0, r1;
  r1.set_dp(1);
  const uint64_t s0 = ResumeSeed("step", r0), s1 = ResumeSeed("step", r1);
  EXPECT_EQ(s0, ResumeSeed("step", r0));
  EXPECT_NE(s0, s1);
  EXPECT_NE(s0, ResumeSeed("other", r0));
  std::set<int64_t> first_delays;
  for (int attempt = 0; attempt < 6; ++attempt) {
    EXPECT_EQ(ResumeDelay(b, attempt, s0), ResumeDelay(b, attempt, s0));
  }
  for (int dp = 0; dp < 16; ++dp) {
    v1::RankCoords r;
    r.set_dp(dp);
    first_delays.insert(absl::ToInt64Microseconds(ResumeDelay(b, 0, ResumeSeed("step", r))));
  }
  // 16 ranks do not all wait the same time (jitter is there), which is
  // what keeps them from reconnecting in lockstep.
  EXPECT_GT(first_delays.size(), 8u);
}

TEST(ResumeDelayTest, ZeroOrNegativeDurationsMeanNoWait) {
  EXPECT_EQ(ResumeDelay({absl::ZeroDuration(), absl::Seconds(1)}, 3, 1), absl::ZeroDuration());
  EXPECT_EQ(ResumeDelay({absl::ZeroDuration(), absl::Seconds(1)}, 1 << 30, 1),
            absl::ZeroDuration());
  EXPECT_EQ(ResumeDelay({absl::Seconds(1), -absl::Seconds(1)}, 0, 1), absl::ZeroDuration());
}

TEST(ResumeFromTest, RoundTripKeepsCodeMessageAndOtherPayloads) {
  absl::Status s = absl::UnavailableError("connection refused");
  s.SetPayload("type.example/other", absl::Cord("x"));
  const absl::Status r = WithResumeFrom(s, 7);
  EXPECT_EQ(r.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.message(), "connection refused; resume from micro-batch 7");
  EXPECT_EQ(ResumeFrom(r), 7);
  EXPECT_EQ(r.GetPayload("type.example/other"), absl::Cord("x"));
  EXPECT_EQ(r.GetPayload(kResumeFromTypeUrl), absl::Cord("7"));
  // Set again (a layer above knows better): replaced, not duplicated.
  EXPECT_EQ(ResumeFrom(WithResumeFrom(r, 9)), 9);
  EXPECT_THAT(std::string(WithResumeFrom(r, 9).message()),
              HasSubstr("resume from micro-batch 9"));
  EXPECT_THAT(std::string(WithResumeFrom(r, 9).message()),
              Not(HasSubstr("resume from micro-batch 7")));
}

TEST(ResumeFromTest, AbsentOrMalformed) {
  EXPECT_EQ(ResumeFrom(absl::UnavailableError("x")), std::nullopt);
  EXPECT_TRUE(WithResumeFrom(absl::OkStatus(), 3).ok());
  EXPECT_EQ(ResumeFrom(WithResumeFrom(absl::OkStatus(), 3)), std::nullopt);
  absl::Status bad = absl::InternalError("x");
  bad.SetPayload(kResumeFromTypeUrl, absl::Cord("seven"));
  EXPECT_EQ(ResumeFrom(bad), std::nullopt);
  bad.SetPayload(kResumeFromTypeUrl, absl::Cord("-1"));
  EXPECT_EQ(ResumeFrom(bad), std::nullopt);
}

}  // namespace
}  // namespace rollpack
