// Topology validation: any wire Topology (protobuf bytes) with any model.
// Oracle: normalisation is idempotent through the wire form (the durable log
// relies on it), and an accepted pipeline assignment gives every layer to
// exactly one stage, in order, with replay layers = owned layers in M (and
// the MTP layers on the last stage with mtp_routing).
#include <algorithm>
#include <set>

#include "fuzz/fuzz_common.h"
#include "scheduler/pipeline_layers.h"
#include "server/store/convert.h"

using namespace rollpack;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const ModelSpec model = FuzzModel(&in);
  const std::string wire = in.ConsumeRemainingBytesAsString();
  v1::Topology proto;
  if (!proto.ParseFromString(wire)) return 0;
  absl::StatusOr<Topology> topology = NormalizeTopology(proto);
  if (!topology.ok()) return 0;
  absl::StatusOr<Topology> again = NormalizeTopology(ToProto(*topology));
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(ToProto(*again).SerializeAsString() == ToProto(*topology).SerializeAsString());
  if (!ValidateTopologySizes(*topology).ok()) return 0;
  if (topology->pp > 64 || topology->vpp > 64) return 0;
  absl::StatusOr<PipelineLayers> layers = PipelineLayers::Create(model, *topology);
  if (!layers.ok()) {
    FUZZ_CHECK(!layers.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(layers->num_stages() == topology->pp);
  const std::vector<int> moe = layers->moe_layers();
  std::vector<int> owner(model.num_layers, -1);
  for (const PipelineStage& stage : layers->stages()) {
    FUZZ_CHECK(std::is_sorted(stage.layers.begin(), stage.layers.end()));
    for (int l : stage.layers) {
      FUZZ_CHECK(l >= 0 && l < model.num_layers);
      FUZZ_CHECK(owner[l] == -1);
      owner[l] = stage.pp_rank;
    }
    std::vector<int> expect;
    for (int l : stage.layers) {
      if (std::find(moe.begin(), moe.end(), l) != moe.end()) expect.push_back(l);
    }
    // MTP layers N..N+D-1 follow on the last stage (layout.md section 10).
    const int mtp = model.is_dense() ? 0 : model.routed_mtp_layers();
    if (stage.pp_rank == topology->pp - 1) {
      for (int d = 0; d < mtp; ++d) expect.push_back(model.num_layers + d);
    }
    FUZZ_CHECK(stage.replay_layers == expect);
    FUZZ_CHECK(stage.replay_positions.size() == stage.replay_layers.size());
    const int num_moe = static_cast<int>(moe.size());
    FUZZ_CHECK(layers->stored_layers() == num_moe + mtp);
    for (size_t i = 0; i < stage.replay_layers.size(); ++i) {
      const int pos = stage.replay_positions[i];
      FUZZ_CHECK(pos >= 0 && pos < num_moe + mtp);
      FUZZ_CHECK((pos < num_moe ? moe[pos] : model.num_layers + pos - num_moe) ==
                 stage.replay_layers[i]);
    }
  }
  FUZZ_CHECK(std::all_of(owner.begin(), owner.end(), [](int o) { return o >= 0; }));
  return 0;
}
