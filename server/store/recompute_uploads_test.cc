// R2 uploads on one store (docs/layout.md section 11): the stage's inverse
// layout without sequence parallelism (every TP rank uploads the same rows),
// atomic refusals, memory accounting and the commit. The end-to-end path
// with a real rollpackd is client/python/tests/test_recompute.py.
#include "server/store/recompute_uploads.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/layout_gather.h"
#include "testing/durable_store.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 4;
constexpr int kExperts = 16;
constexpr int kTopk = 2;

ModelSpec Model() {
  ModelSpec m;
  m.name = "m";
  m.num_layers = kLayers;
  m.moe_layers = {1, 3};
  m.num_experts = kExperts;
  m.topk = kTopk;
  return m;
}

StoredSample Sample(const std::string& id, int64_t n) {
  StoredSample s;
  s.sample_id = id;
  s.tokens.assign(n, 7);
  s.experts.assign(n * 2 * kTopk, '\x01');
  for (int64_t i = 0; i < n * 2; ++i) s.experts[i * kTopk + 1] = '\x02';
  s.row_valid.assign(n, 1);
  return s;
}

// TP = 2 without sequence parallelism, CP = 2: both TP ranks of a CP rank
// see every router row of it.
Topology Topo() {
  Topology t;
  t.cp = 2;
  t.tp = 2;
  t.sequence_parallel = false;
  t.max_tokens_per_rank = 256;
  return t;
}

// K distinct ids of (sequence, token, stored layer).
void MadeUp(int sequence, int64_t token, int layer, int64_t* out) {
  const int64_t base = (sequence * 5 + token * 3 + layer * 7) % kExperts;
  for (int j = 0; j < kTopk; ++j) out[j] = (base + j) % kExperts;
}

class RecomputeUploadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(store_.RegisterModel("p", Model()).ok());
    std::vector<StoredSample> samples;
    for (int i = 0; i < 5; ++i) samples.push_back(Sample("s" + std::to_string(i), 9 + 13 * i));
    ASSERT_TRUE(store_.Put("p", std::move(samples)).ok());
    StepRequest request;
    request.step_id = "a";
    request.pool = "p";
    request.selection.num_samples = 5;
    request.topology = Topo();
    request.reuse_samples = true;
    absl::StatusOr<std::shared_ptr<const Step>> step = store_.CreateStep(request);
    ASSERT_TRUE(step.ok()) << step.status();
    step_ = *step;
  }

  // Rank `coords`' upload of micro-batch m: made-up ids on real rows,
  // `padding_id` on every padding entry (invalid on purpose).
  std::vector<int64_t> Upload(const RankCoords& coords, int m, RankMicrobatchLayout* rank) {
    *rank = *step_->layout.Describe(coords, m);
    const int64_t layers = static_cast<int64_t>(rank->replay_layers.size());
    std::vector<int64_t> ids(rank->router_rows * layers * kTopk, 0);  // padding: repeated 0s
    for (const RowRun& run : rank->router_runs) {
      if (run.padding) continue;
      for (int64_t r = 0; r < run.length; ++r) {
        for (int64_t l = 0; l < layers; ++l) {
          MadeUp(run.sequence, run.source_pos + r, rank->replay_positions[l],
                 &ids[((run.output_row + r) * layers + l) * kTopk]);
        }
      }
    }
    return ids;
  }

  static UploadedRouting View(const std::vector<int64_t>& ids, const RankMicrobatchLayout& rank) {
    UploadedRouting u;
    u.data = reinterpret_cast<const uint8_t*>(ids.data());
    u.size_bytes = static_cast<int64_t>(ids.size() * sizeof(int64_t));
    u.element_bytes = 8;
    u.is_signed = true;
    u.rows = rank.router_rows;
    u.layers = static_cast<int64_t>(rank.replay_layers.size());
    u.topk = kTopk;
    return u;
  }

  // A recompute step over the 5 samples in one micro-batch per rank: a
  // layout other than step "a"'s.
  absl::StatusOr<std::shared_ptr<const Step>> CreateRecomputeStep(const std::string& step_id) {
    StepRequest request;
    request.step_id = step_id;
    request.pool = "p";
    request.selection.num_samples = 5;
    request.topology.max_tokens_per_rank = 1024;
    request.replay_source = ReplaySourceKind::kRecompute;
    return store_.CreateStep(request);
  }

  SampleStore store_{int64_t{1} << 24};
  RecomputeUploads uploads_{&store_};
  std::shared_ptr<const Step> step_;
};

TEST_F(RecomputeUploadsTest, EveryTpRankUploadsTheSameRowsAndTheCommitHoldsThem) {
  const Topology& t = step_->topology;
  int64_t repeated = 0;
  int64_t missing = -1;
  for (int m = 0; m < step_->layout.num_microbatches(); ++m) {
    for (int cp = 0; cp < t.cp; ++cp) {
      for (int tp = 0; tp < t.tp; ++tp) {
        RankMicrobatchLayout rank;
        const std::vector<int64_t> ids = Upload({0, cp, tp, 0}, m, &rank);
        absl::StatusOr<RoutingUploadResult> r =
            uploads_.Upload("a", {0, cp, tp, 0}, m, View(ids, rank));
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->rows, RealRouterRows(rank));
        repeated += r->repeated_rows;
        missing = r->missing_entries;
      }
    }
  }
  EXPECT_EQ(missing, 0);
  // TP rank 1 repeats every row TP rank 0 placed.
  int64_t tokens = 0;
  for (int64_t n : step_->layout.lengths()) tokens += n;
  EXPECT_EQ(repeated, tokens);
  EXPECT_GT(uploads_.staged_bytes(), 0);

  absl::StatusOr<RoutingCommitResult> commit = uploads_.Commit("a");
  ASSERT_TRUE(commit.ok()) << commit.status();
  // A retried commit (its answer lost) answers the same; a late upload is
  // refused instead of starting a new stage.
  absl::StatusOr<RoutingCommitResult> again = uploads_.Commit("a");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stored_bytes, commit->stored_bytes);
  {
    RankMicrobatchLayout rank;
    const std::vector<int64_t> ids = Upload({0, 0, 0, 0}, 0, &rank);
    absl::StatusOr<RoutingUploadResult> late = uploads_.Upload("a", {0, 0, 0, 0}, 0, View(ids, rank));
    EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(late.status().message(), HasSubstr("was committed"));
  }
  EXPECT_EQ(commit->samples, 5);
  EXPECT_EQ(commit->tokens, tokens);
  EXPECT_EQ(commit->stored_bytes, tokens * 2 * kTopk);
  EXPECT_EQ(uploads_.staged_bytes(), 0);
  ASSERT_TRUE(store_.ReleaseStep("a").ok());

  // A recompute step in another layout gathers exactly the made-up ids.
  absl::StatusOr<std::shared_ptr<const Step>> b = CreateRecomputeStep("b");
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ((*b)->replay.recompute_routing.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const std::string& routing = *(*b)->replay.recompute_routing[i];
    const int64_t n = (*b)->layout.lengths()[i];
    ASSERT_EQ(static_cast<int64_t>(routing.size()), n * 2 * kTopk);
    // Step b's sequence i is sample (*b)->sample_ids[i]; its index in step a:
    const auto& a_ids = step_->sample_ids;
    const int in_a = static_cast<int>(
        std::find(a_ids.begin(), a_ids.end(), (*b)->sample_ids[i]) - a_ids.begin());
    for (int64_t token = 0; token < n; ++token) {
      for (int l = 0; l < 2; ++l) {
        int64_t want[kTopk];
        MadeUp(in_a, token, l, want);
        std::sort(want, want + kTopk);  // kept as sets, ascending
        for (int j = 0; j < kTopk; ++j) {
          ASSERT_EQ(static_cast<uint8_t>(routing[(token * 2 + l) * kTopk + j]), want[j])
              << "sample " << i << " token " << token << " layer " << l;
        }
      }
    }
  }
}

TEST_F(RecomputeUploadsTest, RefusalsChangeNothing) {
  RankMicrobatchLayout rank;
  std::vector<int64_t> ids = Upload({0, 0, 0, 0}, 0, &rank);
  ASSERT_TRUE(uploads_.Upload("a", {0, 0, 0, 0}, 0, View(ids, rank)).ok());
  const int64_t staged = uploads_.staged_bytes();

  // The TP peer disagrees on one real row: refused naming both copies.
  std::vector<int64_t> other = Upload({0, 0, 1, 0}, 0, &rank);
  const RowRun* real = nullptr;
  for (const RowRun& run : rank.router_runs) {
    if (!run.padding) {
      real = &run;
      break;
    }
  }
  ASSERT_NE(real, nullptr);
  const int64_t layers = static_cast<int64_t>(rank.replay_layers.size());
  other[(real->output_row * layers) * kTopk] = (other[(real->output_row * layers) * kTopk] + 5) %
                                               kExperts;
  absl::StatusOr<RoutingUploadResult> conflict =
      uploads_.Upload("a", {0, 0, 1, 0}, 0, View(other, rank));
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(conflict.status().message(), HasSubstr("but an earlier upload placed"));
  EXPECT_THAT(conflict.status().message(),
              HasSubstr("sample \"" + step_->sample_ids[real->sequence] + "\" token " +
                        std::to_string(real->source_pos) + " layer 1"));
  // Nothing of the refused upload was placed: the commit still misses the
  // rest, and the correct copy is accepted as entirely repeated.
  absl::StatusOr<RoutingCommitResult> partial = uploads_.Commit("a");
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(partial.status().message(), HasSubstr("was not uploaded"));
  std::vector<int64_t> same = Upload({0, 0, 1, 0}, 0, &rank);
  absl::StatusOr<RoutingUploadResult> again = uploads_.Upload("a", {0, 0, 1, 0}, 0, View(same, rank));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->repeated_rows, again->rows);
  EXPECT_EQ(uploads_.staged_bytes(), staged);
  // The same sets in another order (top-k is unordered) are repeats too.
  for (size_t e = 0; e + kTopk <= same.size(); e += kTopk) {
    std::reverse(same.begin() + e, same.begin() + e + kTopk);
  }
  absl::StatusOr<RoutingUploadResult> reordered =
      uploads_.Upload("a", {0, 0, 1, 0}, 0, View(same, rank));
  ASSERT_TRUE(reordered.ok()) << reordered.status();
  EXPECT_EQ(reordered->repeated_rows, reordered->rows);

  // A fresh upload refused at its very last entry places nothing: made
  // valid, the same upload then places every row as new.
  RankMicrobatchLayout cp1;
  const std::vector<int64_t> fresh = Upload({0, 1, 0, 0}, 0, &cp1);
  const RowRun* last_real = nullptr;
  for (const RowRun& run : cp1.router_runs) {
    if (!run.padding) last_real = &run;
  }
  ASSERT_NE(last_real, nullptr);
  const int64_t cp1_layers = static_cast<int64_t>(cp1.replay_layers.size());
  const int64_t last_id =
      ((last_real->output_row + last_real->length - 1) * cp1_layers + cp1_layers) * kTopk - 1;
  std::vector<int64_t> bad = fresh;
  bad[last_id] = kExperts;
  EXPECT_EQ(uploads_.Upload("a", {0, 1, 0, 0}, 0, View(bad, cp1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<RoutingUploadResult> good = uploads_.Upload("a", {0, 1, 0, 0}, 0, View(fresh, cp1));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->rows, RealRouterRows(cp1));
  EXPECT_EQ(good->repeated_rows, 0);

  // Wrong shape, a micro-batch or rank outside the step.
  UploadedRouting short_view = View(same, rank);
  short_view.rows -= 1;
  EXPECT_EQ(uploads_.Upload("a", {0, 0, 1, 0}, 0, short_view).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(uploads_.Upload("a", {0, 0, 2, 0}, 0, View(same, rank)).ok());
  EXPECT_FALSE(uploads_.Upload("a", {0, 0, 0, 0}, 99, View(same, rank)).ok());

  // Releasing the step drops its stage and gives its memory back.
  const int64_t before = store_.Stats().stored_bytes;
  ASSERT_TRUE(store_.ReleaseStep("a").ok());
  EXPECT_EQ(uploads_.Commit("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(uploads_.staged_bytes(), 0);
  EXPECT_LT(store_.Stats().stored_bytes, before - staged + 1);
}

// Committed routing survives a restart, before and after compaction, and
// only while its sample lives.
TEST(RecomputeRoutingDurableTest, CommitsReplayAndCompact) {
  TempDir dir;
  std::string committed;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    SampleStore& store = *d->store;
    ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
    std::vector<StoredSample> samples;
    samples.push_back(Sample("keep", 11));
    samples.push_back(Sample("gone", 7));
    ASSERT_TRUE(store.Put("p", std::move(samples)).ok());
    StepRequest request;
    request.step_id = "a";
    request.pool = "p";
    request.sample_ids = {"keep"};
    request.topology.max_tokens_per_rank = 64;
    request.reuse_samples = true;
    absl::StatusOr<std::shared_ptr<const Step>> a = store.CreateStep(request);
    ASSERT_TRUE(a.ok());
    committed.assign(11 * 2 * kTopk, '\0');
    for (size_t i = 0; i < committed.size(); ++i) committed[i] = static_cast<char>(i % kExperts);
    ASSERT_TRUE(store.SetRecomputeRouting(*a, {committed}).ok());
    ASSERT_TRUE(store.ReleaseStep("a").ok());
    request.step_id = "g";
    request.sample_ids = {"gone"};
    request.reuse_samples = false;
    absl::StatusOr<std::shared_ptr<const Step>> g = store.CreateStep(request);
    ASSERT_TRUE(g.ok());
    ASSERT_TRUE(store.SetRecomputeRouting(*g, {std::string(7 * 2 * kTopk, '\1')}).ok());
    ASSERT_TRUE(store.ReleaseStep("g").ok());  // deletes "gone" and its routing
  }
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    StepRequest request;
    request.step_id = "b" + std::to_string(round);
    request.pool = "p";
    request.sample_ids = {"keep"};
    request.topology.max_tokens_per_rank = 64;
    request.replay_source = ReplaySourceKind::kRecompute;
    request.reuse_samples = true;
    absl::StatusOr<std::shared_ptr<const Step>> b = d->store->CreateStep(request);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(*(*b)->replay.recompute_routing[0], committed);
    ASSERT_TRUE(d->store->ReleaseStep(request.step_id).ok());
    // Round 0 compacts: round 1 reads the routing from compaction's records.
    if (round == 0) ASSERT_TRUE(d->store->CompactLog().ok());
  }
}

TEST_F(RecomputeUploadsTest, ACommitForAStepMadeAgainGoesNowhere) {
  ASSERT_TRUE(store_.ReleaseStep("a").ok());
  StepRequest request;
  request.step_id = "a";
  request.pool = "p";
  request.selection.num_samples = 5;
  request.topology = Topo();
  ASSERT_TRUE(store_.CreateStep(request).ok());
  std::vector<std::string> routing;
  for (int64_t n : step_->layout.lengths()) routing.emplace_back(n * 2 * kTopk, '\0');
  absl::StatusOr<int64_t> r = store_.SetRecomputeRouting(step_, std::move(routing));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("released (or released and created again)"));
}

// A commit written as several records counts only when every part is in
// the log (a crash between two appends changes nothing).
TEST_F(RecomputeUploadsTest, ReplayAppliesACommitOnlyWithAllItsParts) {
  v1::RecomputeRoutingRecord part0, part1;
  for (v1::RecomputeRoutingRecord* part : {&part0, &part1}) {
    part->set_pool("p");
    part->set_step_id("a");
    part->set_parts(2);
  }
  part1.set_part(1);
  const int64_t n0 = step_->layout.lengths()[0];
  part0.add_sample_ids(step_->sample_ids[0]);
  part0.add_experts(std::string(n0 * 2 * kTopk, '\3'));
  part1.add_sample_ids(step_->sample_ids[1]);
  part1.add_experts(std::string(step_->layout.lengths()[1] * 2 * kTopk, '\4'));
  const int64_t before = store_.Stats().stored_bytes;
  ASSERT_TRUE(store_.ReplayRecomputeRouting(part0).ok());
  EXPECT_EQ(store_.Stats().stored_bytes, before) << "one part of two applies nothing";
  // A new attempt starts at part 0 again; then both parts apply.
  ASSERT_TRUE(store_.ReplayRecomputeRouting(part0).ok());
  ASSERT_TRUE(store_.ReplayRecomputeRouting(part1).ok());
  EXPECT_EQ(store_.Stats().stored_bytes,
            before + (step_->layout.lengths()[0] + step_->layout.lengths()[1]) * 2 * kTopk);
  // A record whose size does not fit its sample is refused as DATA_LOSS.
  v1::RecomputeRoutingRecord wrong;
  wrong.set_pool("p");
  wrong.add_sample_ids(step_->sample_ids[2]);
  wrong.add_experts(std::string(3, '\0'));
  EXPECT_EQ(store_.ReplayRecomputeRouting(wrong).code(), absl::StatusCode::kDataLoss);
}

TEST_F(RecomputeUploadsTest, AStageThatDoesNotFitIsRefused) {
  SampleStore small(4096);
  ASSERT_TRUE(small.RegisterModel("p", Model()).ok());
  std::vector<StoredSample> samples;
  samples.push_back(Sample("big", 300));
  ASSERT_TRUE(small.Put("p", std::move(samples)).ok());
  StepRequest request;
  request.step_id = "a";
  request.pool = "p";
  request.selection.num_samples = 1;
  request.topology.max_tokens_per_rank = 1024;
  ASSERT_TRUE(small.CreateStep(request).ok());
  RecomputeUploads uploads(&small);
  RankMicrobatchLayout rank = *(*small.GetStep("a"))->layout.Describe({0, 0, 0, 0}, 0);
  std::vector<int64_t> ids(rank.router_rows * 2 * kTopk, 0);
  absl::StatusOr<RoutingUploadResult> r = uploads.Upload("a", {0, 0, 0, 0}, 0, View(ids, rank));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("--max-memory"));
  EXPECT_EQ(uploads.staged_bytes(), 0);
}


// Member `self` of a two-member cluster: the samples of the step's
// sequences i with i % 2 == self, held for step "a".
struct Owner {
  explicit Owner(const Step& step, int self) {
    EXPECT_TRUE(store.RegisterModel("p", Model()).ok());
    std::vector<StoredSample> samples;
    for (size_t i = self; i < step.sample_ids.size(); i += 2) {
      ids.push_back(step.sample_ids[i]);
      samples.push_back(Sample(step.sample_ids[i], step.layout.lengths()[i]));
    }
    EXPECT_TRUE(store.Put("p", std::move(samples)).ok());
    EXPECT_TRUE(store.Hold("a", "p", ids, "m0", /*attempt=*/7, /*reuse_samples=*/true).ok());
  }
  SampleStore store{int64_t{1} << 24};
  RecomputeUploads uploads{&store};
  std::vector<std::string> ids;
};

// A cluster member's side survives a restart and a compaction: routing
// committed to held samples, and a RECOMPUTE hold with the routing it took.
TEST(RecomputeRoutingDurableTest, HeldCommitsAndRecomputeHoldsReplay) {
  TempDir dir;
  const std::vector<std::string> ids = {"h1", "h2"};
  const std::vector<std::string> routing = {std::string(5 * 2 * kTopk, '\3'),
                                            std::string(3 * 2 * kTopk, '\4')};
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    SampleStore& store = *d->store;
    ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
    ASSERT_TRUE(store.Put("p", {Sample("h1", 5), Sample("h2", 3)}).ok());
    ASSERT_TRUE(store.Hold("a", "p", ids, "m0", 3, /*reuse_samples=*/true).ok());
    // Another attempt's commit goes nowhere.
    EXPECT_EQ(store.SetHeldRecomputeRouting("a", 4, ids, routing).status().code(),
              absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(store.SetHeldRecomputeRouting("a", 3, ids, routing).ok());
    ASSERT_TRUE(store.ReleaseStep("a").ok());  // reuse: back to the free ones
    ASSERT_TRUE(store.Hold("b", "p", ids, "m0", 5, true, /*recompute=*/true).ok());
  }
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> held =
        d->store->HeldRecomputeRouting("b", ids);
    ASSERT_TRUE(held.ok()) << "round " << round << ": " << held.status();
    EXPECT_EQ(*(*held)[0], routing[0]);
    EXPECT_EQ(*(*held)[1], routing[1]);
    // Round 0 compacts: round 1 reads the hold and routing from its records.
    if (round == 0) ASSERT_TRUE(d->store->CompactLog().ok());
  }
}

// A cluster's R2 (docs/cluster.md): each upload split by owner and staged on
// each owner's hold commits, sample by sample, what one store commits.
TEST_F(RecomputeUploadsTest, SharesSplitByOwnerCommitWhatOneStoreCommits) {
  auto owner = std::make_shared<const std::vector<int32_t>>([&] {
    std::vector<int32_t> o(step_->sample_ids.size());
    for (size_t i = 0; i < o.size(); ++i) o[i] = static_cast<int32_t>(i % 2);
    return o;
  }());
  Owner owners[2] = {Owner(*step_, 0), Owner(*step_, 1)};
  const HeldStep held[2] = {{step_, owner, 0, 7}, {step_, owner, 1, 7}};
  // Nothing uploaded yet: the first phase names a gap.
  absl::StatusOr<RoutingCommitResult> early = owners[0].uploads.CheckHeld(held[0]);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("was not uploaded"));

  const Topology& t = step_->topology;
  int64_t share_rows = 0;
  int wrong_shares = 0;
  for (int m = 0; m < step_->layout.num_microbatches(); ++m) {
    for (int cp = 0; cp < t.cp; ++cp) {
      for (int tp = 0; tp < t.tp; ++tp) {
        RankMicrobatchLayout rank;
        const std::vector<int64_t> ids = Upload({0, cp, tp, 0}, m, &rank);
        const UploadedRouting whole = View(ids, rank);
        ASSERT_TRUE(uploads_.Upload("a", {0, cp, tp, 0}, m, whole).ok());
        std::vector<std::string> shares;
        SplitUploadByOwner(rank, whole, *owner, 2, &shares);
        for (int o = 0; o < 2; ++o) {
          if (shares[o].empty()) continue;
          UploadedRouting share = whole;
          share.data = reinterpret_cast<const uint8_t*>(shares[o].data());
          share.size_bytes = static_cast<int64_t>(shares[o].size());
          absl::StatusOr<RoutingUploadResult> r =
              owners[o].uploads.UploadHeld(held[o], {0, cp, tp, 0}, m, share);
          ASSERT_TRUE(r.ok()) << "owner " << o << " micro-batch " << m << ": " << r.status();
          EXPECT_EQ(r->rows, OwnedRouterRows(rank, *owner, o));
          share_rows += r->rows;
        }
        // The other owner's share is refused by this one (its size says so).
        if (!shares[1].empty() && shares[0].size() != shares[1].size()) {
          ++wrong_shares;
          UploadedRouting wrong = whole;
          wrong.data = reinterpret_cast<const uint8_t*>(shares[1].data());
          wrong.size_bytes = static_cast<int64_t>(shares[1].size());
          EXPECT_EQ(owners[0].uploads.UploadHeld(held[0], {0, cp, tp, 0}, m, wrong).status().code(),
                    absl::StatusCode::kInvalidArgument);
        }
      }
    }
  }
  int64_t tokens = 0;
  for (int64_t n : step_->layout.lengths()) tokens += n;
  EXPECT_EQ(share_rows, 2 * tokens);  // both TP ranks upload every row
  EXPECT_GT(wrong_shares, 0);

  absl::StatusOr<RoutingCommitResult> whole = uploads_.Commit("a");
  ASSERT_TRUE(whole.ok()) << whole.status();
  RoutingCommitResult sum;
  for (int o = 0; o < 2; ++o) {
    absl::StatusOr<RoutingCommitResult> checked = owners[o].uploads.CheckHeld(held[o]);
    ASSERT_TRUE(checked.ok()) << checked.status();
    absl::StatusOr<RoutingCommitResult> committed = owners[o].uploads.CommitHeld(held[o]);
    ASSERT_TRUE(committed.ok()) << committed.status();
    EXPECT_EQ(committed->samples, checked->samples);
    sum.samples += committed->samples;
    sum.tokens += committed->tokens;
    sum.stored_bytes += committed->stored_bytes;
  }
  EXPECT_EQ(sum.samples, whole->samples);
  EXPECT_EQ(sum.tokens, whole->tokens);
  EXPECT_EQ(sum.stored_bytes, whole->stored_bytes);

  // A RECOMPUTE hold on each owner takes the same bytes the one store's
  // recompute step does.
  ASSERT_TRUE(store_.ReleaseStep("a").ok());
  absl::StatusOr<std::shared_ptr<const Step>> b = CreateRecomputeStep("b");
  ASSERT_TRUE(b.ok()) << b.status();
  int compared = 0;
  for (int o = 0; o < 2; ++o) {
    ASSERT_TRUE(owners[o].store.DropHold("a").ok());
    ASSERT_TRUE(owners[o].store.Hold("b", "p", owners[o].ids, "m0", 8, true, /*recompute=*/true)
                    .ok());
    absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> routing =
        owners[o].store.HeldRecomputeRouting("b", owners[o].ids);
    ASSERT_TRUE(routing.ok()) << routing.status();
    for (size_t k = 0; k < owners[o].ids.size(); ++k) {
      const auto at = std::find((*b)->sample_ids.begin(), (*b)->sample_ids.end(), owners[o].ids[k]);
      ASSERT_NE(at, (*b)->sample_ids.end());
      EXPECT_EQ(*(*routing)[k], *(*b)->replay.recompute_routing[at - (*b)->sample_ids.begin()])
          << owners[o].ids[k];
      ++compared;
    }
  }
  EXPECT_EQ(compared, 5);
}

// A RECOMPUTE hold names the sample that has no committed routing.
TEST_F(RecomputeUploadsTest, ARecomputeHoldNamesASampleWithoutRouting) {
  SampleStore store{int64_t{1} << 24};
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("x", 4)}).ok());
  absl::Status held = store.Hold("h", "p", {"x"}, "m0", 1, false, /*recompute=*/true);
  EXPECT_EQ(held.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(held.message(), HasSubstr("sample \"x\" holds no recompute routing"));
  // Nothing was held.
  ASSERT_TRUE(store.Hold("h", "p", {"x"}, "m0", 1).ok());
  EXPECT_EQ(store.HeldRecomputeRouting("h", {"x"}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace rollpack
