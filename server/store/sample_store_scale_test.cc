// CreateStep over 10^5 samples (issue 18: a step of 10^6 one-token samples
// took 68 s): the step is right and the same as the pure planner's, and its
// time grows near n log n, not n^2.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/plan_validation.h"
#include "server/store/convert.h"
#include "server/store/sample_store.h"
#include "server/store/step_builder.h"

namespace rollpack {
namespace {

ModelSpec Dense() {
  ModelSpec m;
  m.name = "dense";
  m.num_layers = 4;
  return m;
}

// `n` one-token samples "<prefix><i>", in that arrival order.
void PutOneTokenSamples(SampleStore& store, const std::string& pool, int n,
                        const std::string& prefix) {
  std::vector<StoredSample> batch;
  batch.reserve(n);
  for (int i = 0; i < n; ++i) {
    StoredSample s;
    s.sample_id = absl::StrCat(prefix, i);
    s.tokens.assign(1, i % 1000);
    batch.push_back(std::move(s));
  }
  ASSERT_TRUE(store.Put(pool, std::move(batch)).ok());
}

// The plan as GetPlan sends it, less what differs between two plannings of
// the same samples (the step's id, the time planning took).
std::string PlanBytes(const Step& step) {
  v1::Plan plan = PlanToProto(step);
  plan.clear_step_id();
  plan.mutable_stats()->clear_plan_ms();
  std::string bytes;
  plan.SerializeToString(&bytes);
  return bytes;
}

TEST(SampleStoreScaleTest, StepOf200kOneTokenSamplesIsTheWholePoolPlannedAsThePlannerDoes) {
  constexpr int kSamples = 200000;
  SampleStore store(int64_t{4} << 30);
  ASSERT_TRUE(store.RegisterModel("p", Dense()).ok());
  PutOneTokenSamples(store, "p", kSamples, "s");
  // Two more that stay free: the step takes the oldest kSamples only.
  PutOneTokenSamples(store, "p", 2, "late-");
  Topology t;
  t.dp = 8;
  t.max_tokens_per_rank = 8192;

  StepRequest request;
  request.step_id = "big";
  request.pool = "p";
  request.selection.num_samples = kSamples;
  request.topology = t;
  request.reuse_samples = true;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(request);
  ASSERT_TRUE(step.ok()) << step.status();
  const Step& s = **step;
  ASSERT_EQ(s.sample_ids.size(), static_cast<size_t>(kSamples));
  ASSERT_EQ(s.samples.size(), static_cast<size_t>(kSamples));
  for (int i = 0; i < kSamples; ++i) {
    ASSERT_EQ(s.sample_ids[i], absl::StrCat("s", i)) << "oldest first, in arrival order";
    ASSERT_EQ(s.samples[i]->sample_id, s.sample_ids[i]);
  }
  const std::vector<int64_t> lengths(kSamples, 1);
  EXPECT_TRUE(ValidatePlan(s.plan, lengths, t).ok());
  EXPECT_EQ(s.plan.stats.num_tokens, kSamples);
  EXPECT_EQ(s.plan.microbatches.size(), 4u);  // 200k tokens / (8 ranks x 8192)
  // The store plans what the planner plans from the ids and lengths alone.
  absl::StatusOr<std::shared_ptr<const Step>> alone =
      BuildStepFromMetadata("big", "p", Dense(), t, s.sample_ids, lengths);
  ASSERT_TRUE(alone.ok()) << alone.status();
  const std::string bytes = PlanBytes(s);
  EXPECT_TRUE(bytes == PlanBytes(**alone)) << "the store's plan differs from the planner's";

  absl::StatusOr<PoolStats> pool = store.GetPool("p");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_free_samples, 2);
  // The late two cannot make a step of 3 while the step holds the rest.
  request.step_id = "more";
  request.selection.num_samples = 3;
  EXPECT_EQ(store.CreateStep(request).status().code(), absl::StatusCode::kFailedPrecondition);

  // Released, the samples are free again in their arrival order: the same
  // step again, byte for byte.
  absl::StatusOr<ReleaseResult> released = store.ReleaseStep("big");
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->returned_samples, kSamples);
  request.step_id = "again";
  request.selection.num_samples = kSamples;
  absl::StatusOr<std::shared_ptr<const Step>> again = store.CreateStep(request);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->sample_ids == s.sample_ids) << "the same step took other samples";
  EXPECT_TRUE(PlanBytes(**again) == bytes) << "the same samples planned differently";
  ASSERT_TRUE(store.ReleaseStep("again").ok());
  EXPECT_EQ(store.GetPool("p")->num_free_samples, kSamples + 2);
}

// This thread's CPU time, ms: CreateStep runs on the caller's thread, and
// unlike wall time this leaves out the time other processes take the core.
double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// One CreateStep of all `n` samples of `pool`, in ms of CPU; the step is
// released (a reuse step: the pool stays the same for the next round).
double CreateStepMs(SampleStore& store, const std::string& pool, int n, int round) {
  Topology t;
  t.dp = 4;
  // The same shape at every n: 4 micro-batches of 4 bins, each bin about
  // n / 16 samples (1/15 of them in room, so the packing is never tight),
  // so a cost quadratic in a bin's samples shows as 16x, not 4x.
  t.max_tokens_per_rank = n / 15;
  StepRequest request;
  request.step_id = absl::StrCat(pool, "-", round);
  request.pool = pool;
  request.selection.num_samples = n;
  request.topology = t;
  request.reuse_samples = true;
  const double start = ThreadCpuMs();
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(request);
  const double ms = ThreadCpuMs() - start;
  EXPECT_TRUE(step.ok()) << step.status();
  if (step.ok()) {
    EXPECT_EQ((*step)->plan.microbatches.size(), 4u);
    EXPECT_TRUE(store.ReleaseStep(request.step_id).ok());
  }
  return ms;
}

TEST(SampleStoreScaleTest, FourTimesTheSamplesTakeLessThanTenTimesTheTime) {
  // n log n gives 4.5x, and caches 5.5-6x on the 2-core development
  // machine; n^2 in any part (selection, lookups, the planner's bins)
  // gives 16x (the planner of issue 18's time: 35x). Measured side by
  // side, alternating, the fastest of 5 each, so a busy CI machine slows
  // both sides alike, on this thread's CPU clock.
  constexpr int kSmall = 50000;
  constexpr int kLarge = 4 * kSmall;
  SampleStore store(int64_t{4} << 30);
  ASSERT_TRUE(store.RegisterModel("small", Dense()).ok());
  ASSERT_TRUE(store.RegisterModel("large", Dense()).ok());
  PutOneTokenSamples(store, "small", kSmall, "a");
  PutOneTokenSamples(store, "large", kLarge, "b");
  // Warm-up: the first step faults in the memory the later ones reuse.
  CreateStepMs(store, "large", kLarge, -1);
  double small = 1e300, large = 1e300;
  for (int round = 0; round < 5; ++round) {
    small = std::min(small, CreateStepMs(store, "small", kSmall, round));
    large = std::min(large, CreateStepMs(store, "large", kLarge, round));
  }
  std::printf("CreateStep of %d one-token samples %.1f CPU ms, of %d %.1f CPU ms: %.2fx\n",
              kSmall, small, kLarge, large, large / small);
  EXPECT_LT(large, 10 * small) << kSmall << " samples: " << small << " CPU ms; " << kLarge
                               << " samples: " << large << " CPU ms";
}

}  // namespace
}  // namespace rollpack
