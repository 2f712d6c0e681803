#include "server/ops/client_abuse_ledger.h"

#include "gtest/gtest.h"

namespace rollpack {
namespace {

using Admission = ClientAbuseLedger::Admission;

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);

TEST(ClientAbuseLedgerTest, ConnectionsPerClientHostAreCapped) {
  ClientAbuseLedger ledger({.max_connections_per_client = 2});
  EXPECT_EQ(ledger.AdmitConnection("ipv4:10.0.0.1", kStart), Admission::kAdmitted);
  EXPECT_EQ(ledger.AdmitConnection("ipv4:10.0.0.1", kStart), Admission::kAdmitted);
  EXPECT_EQ(ledger.AdmitConnection("ipv4:10.0.0.1", kStart), Admission::kTooManyConnections);
  EXPECT_EQ(ledger.AdmitConnection("ipv4:10.0.0.2", kStart), Admission::kAdmitted)
      << "another host has its own connections";
  ledger.ConnectionClosed("ipv4:10.0.0.1");
  EXPECT_EQ(ledger.AdmitConnection("ipv4:10.0.0.1", kStart), Admission::kAdmitted);
}

TEST(ClientAbuseLedgerTest, OverdrawingTheResetBudgetCoolsTheHostDown) {
  ClientAbuseLedger ledger(
      {.max_connections_per_client = 0, .reset_budget = 100, .cooldown = absl::Seconds(10)});
  const std::string host = "ipv4:10.0.0.1";
  ASSERT_EQ(ledger.AdmitConnection(host, kStart), Admission::kAdmitted);
  EXPECT_TRUE(ledger.SpendResets(host, 60, kStart));
  EXPECT_TRUE(ledger.SpendResets(host, 40, kStart));
  EXPECT_FALSE(ledger.SpendResets(host, 1, kStart));
  EXPECT_EQ(ledger.AdmitConnection(host, kStart + absl::Seconds(9)), Admission::kCoolingDown);
  EXPECT_EQ(ledger.AdmitConnection("ipv4:10.0.0.2", kStart), Admission::kAdmitted);
  EXPECT_EQ(ledger.AdmitConnection(host, kStart + absl::Seconds(10)), Admission::kAdmitted);
}

TEST(ClientAbuseLedgerTest, TheBudgetRefillsInThirtySecondsAndIsSharedByConnections) {
  ClientAbuseLedger ledger({.max_connections_per_client = 0, .reset_budget = 300});
  const std::string host = "ipv4:10.0.0.1";
  EXPECT_TRUE(ledger.SpendResets(host, 300, kStart));
  // 10 per second: a client that cancels calls steadily under that rate is
  // never refused.
  for (int s = 1; s <= 120; ++s) {
    EXPECT_TRUE(ledger.SpendResets(host, 10, kStart + absl::Seconds(s))) << "second " << s;
  }
  EXPECT_FALSE(ledger.SpendResets(host, 11, kStart + absl::Seconds(121)));
}

TEST(ClientAbuseLedgerTest, ZeroMeansNoLimit) {
  ClientAbuseLedger ledger({.max_connections_per_client = 0, .reset_budget = 0});
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(ledger.AdmitConnection("ipv4:10.0.0.1", kStart), Admission::kAdmitted);
    ASSERT_TRUE(ledger.SpendResets("ipv4:10.0.0.1", 1'000'000, kStart));
  }
}

}  // namespace
}  // namespace rollpack

namespace rollpack {
namespace {

TEST(ClientAbuseLedgerTest, AFloodsDebtIsBoundedByOneBudget) {
  // 10 resets a second refill it: a debt of a million would take a day.
  ClientAbuseLedger ledger({.max_connections_per_client = 0, .reset_budget = 300});
  const std::string host = "ipv4:10.0.0.1";
  EXPECT_FALSE(ledger.SpendResets(host, 1'000'000, kStart));
  EXPECT_FALSE(ledger.SpendResets(host, 1, kStart + absl::Seconds(29)));
  EXPECT_TRUE(ledger.SpendResets(host, 1, kStart + absl::Seconds(31)));
}

}  // namespace
}  // namespace rollpack
