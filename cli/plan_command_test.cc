#include "cli/plan_command.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

std::string WriteLengths(const std::string& name, const std::vector<int>& v) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path);
  out << "# lengths\n";
  for (int x : v) out << x << "\n";
  return path;
}

int RunCli(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return RunPlanCommand(static_cast<int>(argv.size()), argv.data());
}

TEST(PlanCommandTest, JsonListsSamplesPerRankAndStep) {
  const std::string path = WriteLengths("l1.txt", {6, 4, 5, 5});
  const std::string svg = ::testing::TempDir() + "/plan.svg";
  testing::internal::CaptureStdout();
  const int rc = RunCli({"plan", "--lengths", path, "--dp", "2", "--cp=1",
                      "--max-tokens-per-rank", "10", "--json", "--svg", svg});
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("\"plan_ms\":"));
  EXPECT_THAT(out, HasSubstr("\"padded_lengths\":[6,4,5,5]"));
  EXPECT_THAT(out, HasSubstr("\"groups\":[[[0,1],[2,3]]]"));
  EXPECT_THAT(out, HasSubstr("\"n_mb\":1"));
  std::ifstream in(svg);
  std::string svg_text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_THAT(svg_text, HasSubstr("<svg"));
  EXPECT_THAT(svg_text, HasSubstr("<rect"));
  // Axes, legend and scale: what the picture shows, and how much.
  EXPECT_THAT(svg_text, HasSubstr(">DPxCP rank</text>"));
  EXPECT_THAT(svg_text, HasSubstr(">micro-batch</text>"));
  EXPECT_THAT(svg_text, HasSubstr("attention work per rank"));
  EXPECT_THAT(svg_text, HasSubstr(">idle rank</text>"));
  // The scale's top is the plan's most work on one rank: 6^2 + 4^2 = 52.
  EXPECT_THAT(svg_text, HasSubstr("text-anchor=\"end\">52</text>"));
  EXPECT_THAT(svg_text, HasSubstr("Plan: 1 micro-batches on 2 DPxCP ranks (dp 2, cp 1"));
}

TEST(PlanCommandTest, CpGroupAppearsInEveryRanksList) {
  const std::string path = WriteLengths("l2.txt", {12, 3, 2});
  testing::internal::CaptureStdout();
  const int rc = RunCli({"plan", "--lengths", path, "--dp", "2", "--cp", "1",
                      "--max-tokens-per-rank", "8", "--scheduler", "dynamic_cp",
                      "--json"});
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("\"groups\":[[[0],[0]],[[1],[2]]]"));
}

TEST(PlanCommandTest, HumanTableAndErrors) {
  const std::string path = WriteLengths("l3.txt", {6, 4, 5, 5});
  testing::internal::CaptureStdout();
  EXPECT_EQ(RunCli({"plan", "--lengths", path, "--dp", "2",
                 "--max-tokens-per-rank", "10"}),
            0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_THAT(out, HasSubstr("rank_imb"));
  EXPECT_THAT(out, HasSubstr("sync"));
  EXPECT_THAT(out, HasSubstr("n_mb"));
  testing::internal::CaptureStderr();
  EXPECT_EQ(RunCli({"plan", "--lengths", path, "--dp", "2"}), 2);  // no budget
  EXPECT_EQ(RunCli({"plan", "--bogus"}), 2);
  EXPECT_EQ(RunCli({"plan", "--lengths", path, "--max-tokens-per-rank", "3"}), 1);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("sequence 0"));
}

TEST(PlanCommandTest, HelpListsEveryFlag) {
  testing::internal::CaptureStdout();
  EXPECT_EQ(RunCli({"plan", "--help"}), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_THAT(out, HasSubstr("usage: rollpack plan [flags]"));
  for (const char* flag :
       {"--lengths", "--dp", "--cp", "--tp", "--pp", "--vpp", "--[no-]sequence-parallel",
        "--max-tokens-per-rank", "--scheduler", "--min-cp", "--pad-multiple",
        "--microbatch-group-size", "--[no-]json", "--svg"}) {
    EXPECT_THAT(out, HasSubstr(flag)) << flag;
  }
}

TEST(PlanCommandTest, UsageErrorsNameTheFlag) {
  const std::string path = WriteLengths("l4.txt", {6, 4, 5, 5});
  testing::internal::CaptureStderr();
  EXPECT_EQ(RunCli({"plan", "--lengths", path, "--max-tokens-per-rank", "10", "--dp", "x"}), 2);
  EXPECT_EQ(RunCli({"plan", "--lengths", path, "--max-tokens-per-rank", "10", "--cp=-1"}), 2);
  EXPECT_EQ(RunCli({"plan", "--lengths", path, "--max-tokens-per-rank", "10", "--scheduler",
                    "fancy"}),
            2);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("invalid value 'x' for --dp"));
  EXPECT_THAT(err, HasSubstr("invalid value '-1' for --cp"));
  EXPECT_THAT(err, HasSubstr("invalid value 'fancy' for --scheduler"));
}

TEST(PlanCommandTest, SequenceParallelForms) {
  // With sequence parallelism over tp 2, lengths pad to a multiple of 2.
  const std::string path = WriteLengths("l5.txt", {5, 3});
  for (const auto& [flag, padded] :
       std::vector<std::pair<std::string, std::string>>{
           {"--sequence-parallel", "[6,4]"},
           {"--sequence-parallel=true", "[6,4]"},
           {"--no-sequence-parallel", "[5,3]"},
           {"--sequence-parallel=false", "[5,3]"}}) {
    testing::internal::CaptureStdout();
    const int rc = RunCli({"plan", "--lengths", path, "--tp", "2", flag,
                           "--max-tokens-per-rank", "16", "--json"});
    const std::string out = testing::internal::GetCapturedStdout();
    ASSERT_EQ(rc, 0) << flag;
    EXPECT_THAT(out, HasSubstr(absl::StrCat("\"padded_lengths\":", padded))) << flag;
  }
}

}  // namespace
}  // namespace rollpack
