// The call log's lines, its rate limit on warnings, and the JSON log format.
#include "server/ops/call_log.h"

#include <memory>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ops/log_format.h"
#include "server/ops/log_rate_limiter.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(LogRateLimiterTest, LinesPerWindowPerKeyThenCountsTheDropped) {
  LogRateLimiter limiter(2, absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t dropped = -1;
  EXPECT_TRUE(limiter.Allow("a", t0, &dropped));
  EXPECT_EQ(dropped, 0);
  EXPECT_TRUE(limiter.Allow("a", t0 + absl::Seconds(1), &dropped));
  EXPECT_FALSE(limiter.Allow("a", t0 + absl::Seconds(2), &dropped));
  EXPECT_FALSE(limiter.Allow("a", t0 + absl::Seconds(3), &dropped));
  EXPECT_TRUE(limiter.Allow("b", t0 + absl::Seconds(3), &dropped)) << "keys have own budgets";
  EXPECT_EQ(dropped, 0);
  EXPECT_TRUE(limiter.Allow("a", t0 + absl::Seconds(10), &dropped));
  EXPECT_EQ(dropped, 2);
  EXPECT_TRUE(limiter.Allow("a", t0 + absl::Seconds(11), &dropped));
  EXPECT_EQ(dropped, 0);
}

TEST(LogRateLimiterTest, KeysPastTheLimitShareABudget) {
  LogRateLimiter limiter(1, absl::Seconds(10), /*max_keys=*/2);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t dropped = 0;
  EXPECT_TRUE(limiter.Allow("a", t0, &dropped));
  EXPECT_TRUE(limiter.Allow("b", t0, &dropped));
  EXPECT_TRUE(limiter.Allow("c", t0, &dropped));  // the shared budget's line
  EXPECT_FALSE(limiter.Allow("d", t0, &dropped));
}

TEST(CallLogTest, FormatNamesWhoWhatOutcomeAndNote) {
  CallLog::Call call;
  call.method = "/rollpack.v1.Rollouts/PutSamples";
  call.peer = "ipv4:127.0.0.1:5000";
  call.role = "producer";
  call.code = grpc::StatusCode::INVALID_ARGUMENT;
  call.message = "sample \"s17\": routed_experts has 4095 rows, tokens has 4097";
  call.elapsed = absl::Microseconds(1234);
  EXPECT_EQ(CallLog::Format(call, 3),
            "Rollouts/PutSamples from ipv4:127.0.0.1:5000 (producer): INVALID_ARGUMENT \"sample "
            "\"s17\": routed_experts has 4095 rows, tokens has 4097\" in 1.23ms (3 more like "
            "this were not logged)");
  call.code = grpc::StatusCode::OK;
  call.role = "";
  call.note = "step \"s1\"";
  EXPECT_EQ(CallLog::Format(call, 0),
            "Rollouts/PutSamples from ipv4:127.0.0.1:5000: OK in 1.23ms; step \"s1\"");
}

class CapturedLog {
 public:
  CapturedLog() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    previous_ = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST(CallLogTest, RefusalsAreWarningsRateLimitedAndSuccessesInfoOrDebug) {
  CapturedLog captured;
  ASSERT_TRUE(ConfigureLogging("info", "text").ok());
  CallLog log(nullptr, {/*warnings_per_window=*/2, /*warning_window=*/absl::Hours(1)});
  CallLog::Call refused;
  refused.method = "/rollpack.v1.Rollouts/PutSamples";
  refused.peer = "ipv4:127.0.0.1:1";
  refused.code = grpc::StatusCode::RESOURCE_EXHAUSTED;
  refused.message = "store full";
  for (int i = 0; i < 5; ++i) log.Log(refused);
  CallLog::Call created;
  created.method = "/rollpack.v1.Scheduler/CreateStep";
  created.peer = "ipv4:127.0.0.1:2";
  created.note = "planned";
  log.Log(created);
  CallLog::Call put = created;
  put.method = "/rollpack.v1.Rollouts/PutSamples";
  log.Log(put);
  const std::string text = captured.text();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;
  EXPECT_THAT(text, HasSubstr("[warning] Rollouts/PutSamples from ipv4:127.0.0.1:1: "
                              "RESOURCE_EXHAUSTED \"store full\""));
  EXPECT_THAT(text, HasSubstr("[info] Scheduler/CreateStep from ipv4:127.0.0.1:2: OK"));
  EXPECT_THAT(text, Not(HasSubstr("Rollouts/PutSamples from ipv4:127.0.0.1:2")))
      << "a successful put is debug";
}

TEST(LogFormatTest, JsonLinesEscapeTheMessage) {
  CapturedLog captured;
  ASSERT_TRUE(ConfigureLogging("debug", "json").ok());
  spdlog::debug("a \"quoted\"\tline\\ with \x01 and caf\xc3\xa9 and \xff");
  ASSERT_TRUE(ConfigureLogging("info", "text").ok());
  const std::string line = captured.text();
  EXPECT_THAT(line, HasSubstr(R"("level":"debug")"));
  EXPECT_THAT(line, HasSubstr(R"("msg":"a \"quoted\"\tline\\ with \u0001 and café and \ufffd"})"));
  EXPECT_THAT(line, HasSubstr(R"({"time":")"));
}

TEST(LogFormatTest, JsonEscapeReplacesEveryIllFormedUtf8Sequence) {
  EXPECT_EQ(JsonEscape("\xe2\x82\xac \xf0\x9f\x98\x80"), "\xe2\x82\xac \xf0\x9f\x98\x80");
  // Overlong NUL and slash, a surrogate, past U+10FFFF, a lone continuation,
  // a truncated sequence.
  for (const char* bad : {"\xc0\x80", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                          "\xf5\x80\x80\x80", "\x80", "\xe2\x82"}) {
    const std::string escaped = JsonEscape(bad);
    EXPECT_EQ(escaped.find_first_of("\x80\x90\xa0\xaf\xc0\xe0\xe2\xed\xf4\xf5"),
              std::string::npos)
        << escaped;
    EXPECT_EQ(escaped.rfind("\\ufffd", 0), 0u) << escaped;
  }
}

TEST(CallLogTest, ClientTextCannotForgeLines) {
  CallLog::Call call;
  call.method = "/rollpack.v1.Rollouts/PutSamples";
  call.peer = "ipv4:127.0.0.1:1";
  call.code = grpc::StatusCode::INVALID_ARGUMENT;
  call.message = "token_fields[\"x\n[2026-01-01] [info] fake\"] is bad";
  call.note = "a\rb";
  const std::string line = CallLog::Format(call, 0);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(line.find('\r'), std::string::npos) << line;
  EXPECT_THAT(line, HasSubstr("x\\x0a[2026-01-01]"));
  EXPECT_THAT(line, HasSubstr("; a\\x0db"));
}

TEST(LogFormatTest, RefusesUnknownLevelsAndFormats) {
  absl::Status level = ConfigureLogging("loud", "text");
  EXPECT_EQ(level.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(level.message(), HasSubstr("log level \"loud\" is not one of"));
  EXPECT_EQ(ConfigureLogging("info", "xml").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ConfigureLogging("warn", "text").ok());
  EXPECT_TRUE(ConfigureLogging("info", "text").ok());
}

}  // namespace
}  // namespace rollpack
