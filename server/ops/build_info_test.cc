// The version line and rollpack_build_info agree with base/version.h and
// the libraries linked.
#include "server/ops/build_info.h"

#include <string>

#include "base/version.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(BuildInfoTest, VersionLineNamesEveryPart) {
  const std::string line = VersionLine("rollpackd");
  EXPECT_THAT(line, MatchesRegex("rollpackd [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit ([0-9a-f]+|unknown), "
                                 "gRPC [0-9]+\\.[0-9]+\\.[0-9]+, protobuf [0-9]+\\.[0-9]+\\.[0-9]+\\)"));
  EXPECT_THAT(line, HasSubstr(std::string(" ") + kRollpackVersion + " "));
  EXPECT_THAT(line, HasSubstr("gRPC " + grpc::Version() + ","));
}

TEST(BuildInfoTest, MetricIsOneSeriesOfValueOne) {
  metrics::ScrapeRegistry registry;
  AddBuildInfoMetric(registry);
  const BuildInfo info = CurrentBuildInfo();
  EXPECT_THAT(registry.SerializeText(),
              HasSubstr("rollpack_build_info{commit=\"" + info.commit + "\",grpc=\"" +
                        info.grpc + "\",protobuf=\"" + info.protobuf + "\",version=\"" +
                        info.version + "\"} 1\n"));
}

}  // namespace
}  // namespace rollpack
