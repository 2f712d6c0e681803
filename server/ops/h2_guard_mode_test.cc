#include "server/ops/h2_guard_mode.h"

#include "gtest/gtest.h"

namespace rollpack {
namespace {

TEST(H2GuardModeTest, AutoFrontsWhatOtherHostsReach) {
  EXPECT_TRUE(ChooseH2Guard(H2GuardMode::kAuto, false, /*loopback=*/false, false).fronted);
  EXPECT_TRUE(ChooseH2Guard(H2GuardMode::kAuto, false, /*loopback=*/false, true).fronted);
}

TEST(H2GuardModeTest, AutoFrontsALoopbackPortOnlyWithTokens) {
  const H2GuardChoice with_tokens =
      ChooseH2Guard(H2GuardMode::kAuto, false, /*loopback=*/true, /*auth_tokens=*/true);
  EXPECT_TRUE(with_tokens.fronted);
  EXPECT_NE(with_tokens.why.find("--auth-tokens"), std::string::npos) << with_tokens.why;
  const H2GuardChoice without =
      ChooseH2Guard(H2GuardMode::kAuto, false, /*loopback=*/true, /*auth_tokens=*/false);
  EXPECT_FALSE(without.fronted);
  EXPECT_NE(without.why.find("without --auth-tokens"), std::string::npos) << without.why;
}

TEST(H2GuardModeTest, TrueAndFalseOverrideAutoButNotMutualTls) {
  for (bool loopback : {false, true}) {
    for (bool tokens : {false, true}) {
      EXPECT_TRUE(ChooseH2Guard(H2GuardMode::kOn, false, loopback, tokens).fronted);
      EXPECT_FALSE(ChooseH2Guard(H2GuardMode::kOff, false, loopback, tokens).fronted);
      for (H2GuardMode mode : {H2GuardMode::kAuto, H2GuardMode::kOn, H2GuardMode::kOff}) {
        EXPECT_FALSE(ChooseH2Guard(mode, /*mutual_tls=*/true, loopback, tokens).fronted);
      }
    }
  }
}

}  // namespace
}  // namespace rollpack
