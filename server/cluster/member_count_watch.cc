#include "server/cluster/member_count_watch.h"

#include "absl/strings/str_cat.h"
#include "server/cluster/cluster.h"
#include "spdlog/spdlog.h"

namespace rollpack {

std::optional<std::string> MemberCountWarning(int live, int expected, const std::string& name) {
  if (live >= expected) return std::nullopt;
  return absl::StrCat("cluster \"", name, "\" has ", live, " live member", live == 1 ? "" : "s",
                      " of the ", expected,
                      " --cluster-expect-members asks for: are the others running, and with "
                      "the same --cluster-name and --cluster-etcd?");
}

MemberCountWatch::MemberCountWatch(Cluster* cluster, int expected, absl::Duration period)
    : cluster_(cluster), expected_(expected), period_(period) {
  thread_ = std::thread([this] { Loop(); });
}

MemberCountWatch::~MemberCountWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void MemberCountWatch::Loop() {
  absl::MutexLock lock(&mu_);
  // The first look a period after start: members started together join
  // within moments of each other.
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), period_)) {
    if (std::optional<std::string> warning = MemberCountWarning(
            cluster_->last_member_count(), expected_, cluster_->options().name)) {
      spdlog::warn("rollpackd: {}", *warning);
    }
  }
}

}  // namespace rollpack
