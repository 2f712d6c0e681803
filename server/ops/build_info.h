// What a binary was built from: rollpack's version and commit and the gRPC
// and protobuf it runs on. `rollpackd --version` and `rollpack --version`
// print it; rollpackd exports it as rollpack_build_info (docs/operations.md),
// so a dashboard shows which build every member of a fleet runs.
#ifndef ROLLPACK_SERVER_OPS_BUILD_INFO_H_
#define ROLLPACK_SERVER_OPS_BUILD_INFO_H_

#include <string>

#include "absl/strings/string_view.h"
#include "server/ops/metrics/scrape_registry.h"

namespace rollpack {

struct BuildInfo {
  std::string version;   // base/version.h, e.g. "0.1.0"
  std::string commit;    // short git commit, or "unknown"
  std::string grpc;      // the gRPC library linked, e.g. "1.51.1"
  std::string protobuf;  // the protobuf headers built against, e.g. "3.21.12"
};

BuildInfo CurrentBuildInfo();

// "rollpackd 0.1.0 (commit abc1234, gRPC 1.51.1, protobuf 3.21.12)".
std::string VersionLine(absl::string_view program);

// rollpack_build_info{version,commit,grpc,protobuf} 1: the usual info-gauge,
// joined onto other series with `* on (instance) group_left(version)`.
void AddBuildInfoMetric(metrics::ScrapeRegistry& registry);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_BUILD_INFO_H_
