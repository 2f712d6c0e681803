#include "server/ops/build_info.h"

#include "absl/strings/str_cat.h"
#include "base/version.h"
#include "google/protobuf/stubs/common.h"
#include "grpcpp/grpcpp.h"

namespace rollpack {

BuildInfo CurrentBuildInfo() {
  // GOOGLE_PROTOBUF_VERSION is major * 1000000 + minor * 1000 + patch.
  constexpr int kProtobuf = GOOGLE_PROTOBUF_VERSION;
  return BuildInfo{kRollpackVersion, BuildCommit(), grpc::Version(),
                   absl::StrCat(kProtobuf / 1000000, ".", kProtobuf / 1000 % 1000, ".",
                                kProtobuf % 1000)};
}

std::string VersionLine(absl::string_view program) {
  const BuildInfo info = CurrentBuildInfo();
  return absl::StrCat(program, " ", info.version, " (commit ", info.commit, ", gRPC ", info.grpc,
                      ", protobuf ", info.protobuf, ")");
}

void AddBuildInfoMetric(metrics::ScrapeRegistry& registry) {
  const BuildInfo info = CurrentBuildInfo();
  registry
      .AddGauge("rollpack_build_info",
                "Always 1; its labels name the build: rollpack version, git commit, gRPC and "
                "protobuf versions")
      .Add({{"version", info.version},
            {"commit", info.commit},
            {"grpc", info.grpc},
            {"protobuf", info.protobuf}})
      .Set(1);
}

}  // namespace rollpack
