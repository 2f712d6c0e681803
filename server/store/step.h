// A step: samples taken out of a pool's free samples, with the plan that
// packs them and the layout every trainer rank is served from. Immutable once
// created, so any number of trainer streams read it without locks.
#ifndef ROLLPACK_SERVER_STORE_STEP_H_
#define ROLLPACK_SERVER_STORE_STEP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/advantages.h"
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

// What every micro-batch says about its sequences (lifecycle.md section 6;
// docs/layout.md section 12), per sample in the step's order. Fixed when the
// step is made: a sample in a live step takes no annotation.
struct StepMetadata {
  // "" for an ungrouped sample (no group_id, or group_size 0).
  std::vector<std::string> group_ids;
  std::vector<int64_t> policy_versions;
  // The scalars every sample of the step has, by name (sorted: the order
  // the encoder writes Microbatch.scalars in; an empty name is left out),
  // one value per sample.
  std::map<std::string, std::vector<double>> scalars;
  // The estimator as CreateStep asked (a cluster step's record keeps the
  // estimator alone), and one advantage per sample unless it is kNone.
  AdvantageRequest advantage;
  std::vector<float> advantages;

  // A step made before lifecycle.md section 6 (a cluster record written by
  // an older planner): its micro-batches say nothing per sequence.
  bool empty() const { return group_ids.empty() && policy_versions.empty(); }
};

struct Step {
  Step(std::string step_id, std::string pool, ModelSpec model, Topology topology,
       std::vector<std::string> sample_ids,
       std::vector<std::shared_ptr<const StoredSample>> samples, Plan plan,
       StepLayout layout, int32_t num_groups = 0, bool reuse_samples = false,
       StepReplay replay = {}, StepMetadata metadata = {})
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
        replay(std::move(replay)),
        metadata(std::move(metadata)) {}

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
  // Group ids, versions, scalars and advantages of the step's samples.
  const StepMetadata metadata;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STEP_H_
