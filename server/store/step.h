// A step: samples taken out of a pool's free samples, with the plan that
// packs them and the layout every trainer rank is served from. Immutable once
// created, so any number of trainer streams read it without locks.
#ifndef ROLLPACK_SERVER_STORE_STEP_H_
#define ROLLPACK_SERVER_STORE_STEP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/layout.h"
#include "scheduler/model_spec.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"
#include "server/store/stored_sample.h"

namespace rollpack {

// Which routing a step's ranks replay (docs/layout.md section 11).
enum class ReplaySourceKind {
  kRollout,    // the samples' routed_experts (R3)
  kRecompute,  // the routing committed from a recompute forward (R2)
};

struct StepReplay {
  ReplaySourceKind source = ReplaySourceKind::kRollout;
  // kRecompute: recompute_routing[i] is the step's sample i's, [n_i, stored
  // layers, K] ids of the store's width, every row replayable. Shared with
  // the store, which never changes one in place (a commit replaces it).
  std::vector<std::shared_ptr<const std::string>> recompute_routing;
};

struct Step {
  Step(std::string step_id, std::string pool, ModelSpec model, Topology topology,
       std::vector<std::string> sample_ids,
       std::vector<std::shared_ptr<const StoredSample>> samples, Plan plan,
       StepLayout layout, int32_t num_groups = 0, bool reuse_samples = false,
       StepReplay replay = {})
      : step_id(std::move(step_id)),
        pool(std::move(pool)),
        model(std::move(model)),
        topology(topology),
        sample_ids(std::move(sample_ids)),
        samples(std::move(samples)),
        plan(std::move(plan)),
        layout(std::move(layout)),
        num_groups(num_groups),
        reuse_samples(reuse_samples),
        replay(std::move(replay)) {}

  const std::string step_id;
  const std::string pool;
  const ModelSpec model;
  const Topology topology;
  // The plan's sequence i is the sample sample_ids[i].
  const std::vector<std::string> sample_ids;
  // samples[i] holds it; shared so a stream in flight keeps its data alive
  // after the step is released. Empty for a cluster step's plan, whose
  // samples stay on the members that hold them (server/cluster/).
  const std::vector<std::shared_ptr<const StoredSample>> samples;
  const Plan plan;
  const StepLayout layout;
  // Complete groups among the samples (lifecycle.md).
  const int32_t num_groups;
  // Releasing the step returns the samples to the free set.
  const bool reuse_samples;
  // What the ranks replay.
  const StepReplay replay;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STEP_H_
