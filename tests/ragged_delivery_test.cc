// Ragged per-token fields (docs/layout.md section 13) delivered end to end
// through real processes: two rollpackd members of a cluster (a real etcd)
// each hold samples with a `sampling_mask` in every accepted input form;
// every rank of a step over dynamic CP, zigzag CP 2 and two pipeline stages
// fetches its micro-batches by direct pulls (a piece from each member) and
// through FetchMicrobatches, and each is compared with the independent
// reference layout, for both stored id widths (uint16 and int32).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/cluster_fixture.h"
#include "testing/rank_fetch.h"
#include "testing/reference_layout.h"

namespace rollpack {
namespace {

// Little-endian bytes of `values` as `bytes`-wide integers.
template <typename T>
std::string Packed(const std::vector<T>& values, int bytes) {
  std::string out;
  for (T v : values) {
    const int64_t wide = static_cast<int64_t>(v);
    out.append(reinterpret_cast<const char*>(&wide), bytes);
  }
  return out;
}

// Adds a sampling_mask to each sample: per generated token 1 to 12
// distinct ids in [0, V), none for the first few (prompt) tokens; values
// and offsets in the forms producers send (int32 values with int64
// offsets, int64 with int32, uint16 with int64 where V fits, int32 with
// int32: the store widens the offsets to int64).
void AddSamplingMasks(int vocab_size, uint64_t seed, std::vector<v1::Sample>* samples) {
  std::mt19937_64 rng(seed);
  int form = 0;
  for (v1::Sample& sample : *samples) {
    const int64_t n = sample.tokens().shape(0);
    const int64_t prompt = std::min<int64_t>(n, 1 + rng() % 8);
    std::vector<int64_t> values, offsets = {0};
    for (int64_t t = 0; t < n; ++t) {
      const int kept = t < prompt ? 0 : 1 + static_cast<int>(rng() % 12);
      std::set<int64_t> ids;  // a kept set: each id once (section 13)
      while (static_cast<int>(ids.size()) < kept)
        ids.insert(static_cast<int64_t>(rng() % vocab_size));
      std::vector<int64_t> shuffled(ids.begin(), ids.end());  // in any order
      std::shuffle(shuffled.begin(), shuffled.end(), rng);
      values.insert(values.end(), shuffled.begin(), shuffled.end());
      offsets.push_back(static_cast<int64_t>(values.size()));
    }
    const int f = form++ % 4;
    const v1::DType values_dtype =
        f == 1 ? v1::INT64 : (f == 2 && vocab_size <= 65536 ? v1::UINT16 : v1::INT32);
    const v1::DType offsets_dtype = f == 1 || f == 3 ? v1::INT32 : v1::INT64;
    v1::RaggedArray& mask = (*sample.mutable_ragged_token_fields())["sampling_mask"];
    mask.mutable_values()->set_dtype(values_dtype);
    mask.mutable_values()->add_shape(static_cast<int64_t>(values.size()));
    mask.mutable_values()->set_data(Packed(values, values_dtype == v1::INT64    ? 8
                                                   : values_dtype == v1::UINT16 ? 2
                                                                                : 4));
    mask.mutable_offsets()->set_dtype(offsets_dtype);
    mask.mutable_offsets()->add_shape(n + 1);
    mask.mutable_offsets()->set_data(Packed(offsets, offsets_dtype == v1::INT64 ? 8 : 4));
  }
}

class RaggedDeliveryTest : public ClusterFixture {};

TEST_F(RaggedDeliveryTest, EveryRankGetsItsRowsListsByDirectPullsAndThroughOneMember) {
  StartMember(0);
  StartMember(1);
  struct PoolCase {
    const char* pool;
    int vocab_size;  // <= 65536: stored and delivered as uint16, else int32
  };
  for (const PoolCase& pc : {PoolCase{"narrow", 32000}, PoolCase{"wide", 151936}}) {
    SCOPED_TRACE(pc.pool);
    v1::ModelSpec model = ClusterModel();
    model.set_vocab_size(pc.vocab_size);
    ASSERT_TRUE(Client(0).RegisterModel(pc.pool, model).ok());
    std::vector<v1::Sample> all;
    for (int m = 0; m < 2; ++m) {
      std::vector<v1::Sample> samples =
          ClusterSamples(10, 40 + m, absl::StrCat(pc.pool, "-m", m, "-"));
      AddSamplingMasks(pc.vocab_size, 7 + m, &samples);
      absl::StatusOr<v1::PutSamplesResponse> put = Client(m).PutSamples(pc.pool, samples);
      ASSERT_TRUE(put.ok()) << put.status();
      all.insert(all.end(), samples.begin(), samples.end());
    }
    std::map<std::string, const v1::Sample*> by_id;
    for (const v1::Sample& s : all) by_id[s.sample_id()] = &s;

    v1::Topology zigzag;  // static CP 2: every sequence split in 4 chunks, padded to 4
    zigzag.set_cp(2);
    zigzag.set_pp(2);
    zigzag.set_max_tokens_per_rank(256);
    for (const v1::Topology& topology : {HybridTopology(), zigzag}) {
      const std::string step_id =
          absl::StrCat(pc.pool, topology.scheduler() == v1::DYNAMIC_CP ? "-dynamic" : "-static");
      SCOPED_TRACE(step_id);
      v1::CreateStepRequest create;
      create.set_step_id(step_id);
      create.set_pool(pc.pool);
      create.set_num_samples(20);      // both members' samples
      create.set_reuse_samples(true);  // released, free for the next step
      *create.mutable_topology() = topology;
      ASSERT_TRUE(Client(0).CreateStep(create).ok());
      absl::StatusOr<v1::Plan> plan = Client(0).GetPlan(step_id);
      ASSERT_TRUE(plan.ok()) << plan.status();
      int64_t lists = 0;
      for (const v1::RankCoords& rank : AllRanks(plan->topology())) {
        for (Delivery delivery : {Delivery::kDirect, Delivery::kProxy}) {
          const int via = delivery == Delivery::kDirect ? 0 : 1;
          absl::StatusOr<std::vector<v1::Microbatch>> got =
              FetchRankMicrobatches(members_[via]->address(), step_id, rank, delivery);
          ASSERT_TRUE(got.ok()) << got.status();
          ASSERT_EQ(static_cast<int>(got->size()), plan->microbatches_size());
          for (const v1::Microbatch& mb : *got) {
            absl::StatusOr<ExpectedMicrobatch> want =
                ReferenceMicrobatch(*plan, model, by_id, rank, mb.index());
            ASSERT_TRUE(want.ok()) << want.status();
            absl::Status same = CheckMicrobatch(mb, *want, plan->topology(), rank, model, false);
            ASSERT_TRUE(same.ok()) << same << (via == 0 ? " (direct pulls)" : " (one member)");
            for (const auto& [name, field] : mb.ragged_token_fields()) {
              lists += field.offsets().shape(0) - 1;
            }
          }
        }
      }
      // Not vacuous: the last stage's ranks got lists, for every row.
      EXPECT_GT(lists, 0);
      ASSERT_TRUE(Client(0).ReleaseStep(step_id).ok());  // the samples are free again
    }
  }
}

}  // namespace
}  // namespace rollpack
