#include "server/store/names.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(NamesTest, PrintableUtf8UpToTheLimitIsAccepted) {
  EXPECT_TRUE(ValidateName("pool name", "qwen3-30b/grpo.v2", 128).ok());
  EXPECT_TRUE(ValidateName("pool name", "Größe-池-🙂", 128).ok());
  EXPECT_TRUE(ValidateName("pool name", std::string(128, 'a'), 128).ok());
}

TEST(NamesTest, RefusalsNameTheFieldWithoutEchoingTheName) {
  const absl::Status empty = ValidateName("step_id", "", 128);
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.message(), "step_id is empty");

  const std::string huge(10 << 20, 'x');
  const absl::Status long_name = ValidateName("pool name", huge, 128);
  EXPECT_EQ(long_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(long_name.message(), "pool name has 10485760 bytes, at most 128");

  for (const std::string& bad : {std::string("a\nb"), std::string("tab\there"), std::string("\x7f"),
                                std::string("\xc0\xaf"),          // overlong '/'
                                std::string("\xed\xa0\x80"),      // a surrogate
                                std::string("\xc2\x85"),          // C1 control (NEL)
                                std::string("cut\xe2\x82"),       // truncated sequence
                                std::string("\xf5\x80\x80\x80"),  // past U+10FFFF
                                std::string("nul\0here", 8)}) {
    const absl::Status s = ValidateName("pool name", bad, 128);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("control character or invalid UTF-8"));
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr(bad)));
  }
}

}  // namespace
}  // namespace rollpack
