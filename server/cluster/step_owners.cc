#include "server/cluster/step_owners.h"

#include <vector>

#include "server/cluster/peer_calls.h"

namespace rollpack {

void ForEachOwner(
    Cluster* cluster, const v1::ClusterStepRecord& record, absl::Duration timeout,
    absl::FunctionRef<void(int i)> local,
    absl::FunctionRef<void(int i, v1::Member::Stub* stub, grpc::ClientContext* context)> remote) {
  std::vector<char> owns(record.members_size(), 0);
  for (int32_t o : record.owner()) owns[o] = 1;
  ForEachParallel(owns.size(), [&](size_t m) {
    if (!owns[m]) return;
    const int i = static_cast<int>(m);
    const std::string& member = record.members(i);
    if (member == cluster->self().id) {
      local(i);
      return;
    }
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    remote(i, cluster->MemberStub({member, member}), &context);
  });
}

}  // namespace rollpack
