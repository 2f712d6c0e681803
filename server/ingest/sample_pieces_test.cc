// Rollouts in pieces (../shared/spec/lifecycle.md section 5), validated as
// ingest validates them and stored: a sample sent in pieces is stored as the
// same sample sent whole, every refusal leaves the store as it was, and the
// durable log recovers open and sealed samples before and after compaction.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ingest/sample_validation.h"
#include "server/store/sample_store.h"
#include "testing/durable_store.h"
#include "testing/ndarrays.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// 4 layers, MoE layers {1, 2, 3}, E = 8, K = 2.
ModelSpec Model() {
  ModelSpec m;
  m.name = "m";
  m.num_layers = 4;
  m.moe_layers = {1, 2, 3};
  m.num_experts = 8;
  m.topk = 2;
  return m;
}

// The whole rollout the pieces are cut from: n tokens, routed rows for all
// but the last (what an engine records), a logprobs field and a scalar.
struct Rollout {
  std::string id;
  int64_t n = 0;
  int64_t rows = 0;
  std::string group = "g";

  int32_t Token(int64_t i) const { return static_cast<int32_t>(1000 + i); }
  int32_t Expert(int64_t row, int layer, int j) const {
    return static_cast<int32_t>((row * 3 + layer * 5 + j * 4 + (row % 2)) % 8);
  }

  // Tokens [token_begin, token_end) and routed rows [row_begin, row_end).
  v1::Sample Piece(int piece, bool partial, int64_t token_begin, int64_t token_end,
                   int64_t row_begin, int64_t row_end, int64_t version = 5) const {
    v1::Sample s;
    s.set_sample_id(id);
    s.set_piece(piece);
    s.set_partial(partial);
    s.set_policy_version(version);
    if (piece == 0) {
      s.set_group_id(group);
      s.set_group_size(1);
      (*s.mutable_scalars())["reward"] = 1.5;
    }
    const int64_t t = token_end - token_begin;
    if (t > 0) {
      std::vector<int32_t> tokens;
      std::vector<float> logprobs;
      for (int64_t i = token_begin; i < token_end; ++i) {
        tokens.push_back(Token(i));
        logprobs.push_back(-0.25f * static_cast<float>(i));
      }
      *s.mutable_tokens() = TestArray(v1::INT32, {t}, tokens);
      (*s.mutable_token_fields())["logprobs"] = TestArray(v1::FLOAT32, {t}, logprobs);
    }
    if (row_end > row_begin) {
      std::vector<int32_t> ids;
      for (int64_t r = row_begin; r < row_end; ++r)
        for (int l = 0; l < 4; ++l)
          for (int j = 0; j < 2; ++j) ids.push_back(Expert(r, l, j));
      *s.mutable_routed_experts() = TestArray(v1::INT32, {row_end - row_begin, 4, 2}, ids);
      s.set_routed_experts_row_offset(static_cast<int32_t>(row_begin));
    }
    return s;
  }
  v1::Sample Whole(int64_t version = 5) const {
    v1::Sample s = Piece(0, false, 0, n, 0, rows, version);
    return s;
  }
};

absl::StatusOr<PutResult> PutMessage(SampleStore& store, const v1::Sample& message) {
  absl::StatusOr<StoredSample> validated = ValidateSample(message, Model());
  if (!validated.ok()) return validated.status();
  std::vector<StoredSample> batch;
  batch.push_back(*std::move(validated));
  return store.Put("p", std::move(batch));
}

Topology Topo() {
  Topology t;
  t.max_tokens_per_rank = 1 << 16;
  return t;
}

// The sample as a step holds it.
absl::StatusOr<StoredSample> Taken(SampleStore& store, const std::string& id) {
  static int step = 0;
  const std::string step_id = absl::StrCat("take-", step++);
  absl::StatusOr<std::shared_ptr<const Step>> created =
      store.CreateStep(step_id, "p", {id}, 0, Topo());
  if (!created.ok()) return created.status();
  return *(*created)->samples.at(0);
}

// Everything but the piece bounds: what a trainer receives.
void ExpectSameContent(const StoredSample& a, const StoredSample& b) {
  EXPECT_EQ(a.sample_id, b.sample_id);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_EQ(a.row_valid, b.row_valid);
  EXPECT_EQ(a.token_fields, b.token_fields);
  EXPECT_EQ(a.policy_version, b.policy_version);
  EXPECT_EQ(a.group_id, b.group_id);
  EXPECT_EQ(a.group_size, b.group_size);
  EXPECT_TRUE(SameScalars(a.scalars, b.scalars));
}

class SamplePiecesTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(store_.RegisterModel("p", Model()).ok()); }
  SampleStore store_{int64_t{1} << 30};
};

TEST_F(SamplePiecesTest, PiecesMakeTheSameSampleAsOneMessage) {
  // Three pieces the way an engine continues a rollout: each piece's rows
  // start where the stored rows end (one token back) and stop one token short.
  const Rollout r{"s", 12, 11};
  ASSERT_TRUE(PutMessage(store_, r.Piece(0, true, 0, 5, 0, 4)).ok());
  EXPECT_EQ(store_.GetPool("p")->num_open_samples, 1);
  EXPECT_EQ(store_.GetPool("p")->num_free_samples, 0);
  ASSERT_TRUE(PutMessage(store_, r.Piece(1, true, 5, 9, 4, 8)).ok());
  ASSERT_TRUE(PutMessage(store_, r.Piece(2, false, 9, 12, 8, 11)).ok());
  const PoolStats pool = *store_.GetPool("p");
  EXPECT_EQ(pool.num_open_samples, 0);
  EXPECT_EQ(pool.num_free_samples, 1);
  EXPECT_EQ(pool.num_complete_groups, 1);
  absl::StatusOr<StoredSample> taken = Taken(store_, "s");
  ASSERT_TRUE(taken.ok()) << taken.status();
  ExpectSameContent(*taken, *ValidateSample(r.Whole(), Model()));
  EXPECT_EQ(taken->pieces.size(), 3u);
}

TEST_F(SamplePiecesTest, RandomCutsMakeTheSameSample) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    SampleStore store(int64_t{1} << 30);
    ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
    const int64_t n = 2 + static_cast<int64_t>(rng() % 40);
    const bool last_row = rng() % 2 == 0;
    const Rollout r{"s", n, last_row ? n : n - 1};
    // Cut points, then each piece's rows end anywhere from its start to its
    // tokens' end (the last piece: at r.rows).
    std::vector<int64_t> cuts{0, n};
    const int pieces = 1 + static_cast<int>(rng() % std::min<int64_t>(n, 8));
    while (static_cast<int>(cuts.size()) < pieces + 1) {
      const int64_t c = 1 + static_cast<int64_t>(rng() % (n - 1));
      if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
    }
    std::sort(cuts.begin(), cuts.end());
    int64_t rows_end = 0;
    for (int k = 0; k < pieces; ++k) {
      const bool last = k == pieces - 1;
      const int64_t end = last ? r.rows
                               : rows_end + static_cast<int64_t>(
                                                rng() % (std::min(cuts[k + 1], r.rows) - rows_end + 1));
      const v1::Sample message =
          r.Piece(k, !last, cuts[k], cuts[k + 1], rows_end, end, /*version=*/10 - k);
      absl::StatusOr<PutResult> put = PutMessage(store, message);
      ASSERT_TRUE(put.ok()) << "trial " << trial << " piece " << k << ": " << put.status();
      rows_end = end;
    }
    absl::StatusOr<StoredSample> taken = Taken(store, "s");
    ASSERT_TRUE(taken.ok()) << taken.status();
    const v1::Sample whole = r.Whole(/*version=*/10 - (pieces - 1));
    ExpectSameContent(*taken, *ValidateSample(whole, Model()));
  }
}

TEST_F(SamplePiecesTest, OpenSamplesAreNotSelectable) {
  const Rollout r{"s", 6, 5};
  ASSERT_TRUE(PutMessage(store_, r.Piece(0, true, 0, 3, 0, 2)).ok());
  absl::StatusOr<StoredSample> taken = Taken(store_, "s");
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(taken.status().message(), HasSubstr("sample \"s\" is open (1 pieces stored"));
  absl::StatusOr<std::shared_ptr<const Step>> by_count = store_.CreateStep("c", "p", {}, 1, Topo());
  EXPECT_EQ(by_count.status().code(), absl::StatusCode::kFailedPrecondition);
  // Its group counts it against the size, not as complete.
  EXPECT_EQ(store_.GetPool("p")->num_incomplete_groups, 1);
  const Rollout other{"t", 4, 3};
  absl::StatusOr<PutResult> overfull = PutMessage(store_, other.Whole());
  EXPECT_EQ(overfull.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(overfull.status().message(), HasSubstr("group \"g\" already has 1 samples"));
}

TEST_F(SamplePiecesTest, ResendsAreDuplicatesAndOtherContentIsRefused) {
  const Rollout r{"s", 8, 7};
  const v1::Sample p0 = r.Piece(0, true, 0, 4, 0, 3);
  const v1::Sample p1 = r.Piece(1, false, 4, 8, 3, 7);
  ASSERT_TRUE(PutMessage(store_, p0).ok());
  EXPECT_EQ(PutMessage(store_, p0)->duplicates, 1);
  ASSERT_TRUE(PutMessage(store_, p1).ok());
  // After sealing, both pieces are still recognised.
  EXPECT_EQ(PutMessage(store_, p0)->duplicates, 1);
  EXPECT_EQ(PutMessage(store_, p1)->duplicates, 1);
  v1::Sample changed = p1;
  changed.set_policy_version(6);
  absl::StatusOr<PutResult> other = PutMessage(store_, changed);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(other.status().message(), HasSubstr("with a different piece 1"));
  // Extending a sealed sample.
  absl::StatusOr<PutResult> more = PutMessage(store_, r.Piece(2, false, 8, 9, 7, 8));
  EXPECT_EQ(more.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(more.status().message(), HasSubstr("sample \"s\" is sealed (2 pieces)"));
  // The whole sample under the same id is other content.
  EXPECT_EQ(PutMessage(store_, r.Whole()).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(SamplePiecesTest, RefusalsNameTheRuleAndChangeNothing) {
  const Rollout r{"s", 10, 9};
  ASSERT_TRUE(PutMessage(store_, r.Piece(0, true, 0, 4, 0, 3)).ok());
  const PoolStats before = *store_.GetPool("p");
  auto expect = [&](const v1::Sample& message, absl::StatusCode code, const std::string& part) {
    absl::StatusOr<PutResult> put = PutMessage(store_, message);
    EXPECT_EQ(put.status().code(), code) << put.status();
    EXPECT_THAT(put.status().message(), HasSubstr(part));
    const PoolStats after = *store_.GetPool("p");
    EXPECT_EQ(after.stored_bytes, before.stored_bytes);
    EXPECT_EQ(after.num_open_samples, 1);
  };
  expect(r.Piece(2, true, 4, 6, 3, 5), absl::StatusCode::kFailedPrecondition,
         "has 1 pieces stored; the next is piece 1, got piece 2");
  Rollout unknown = r;
  unknown.id = "nope";
  expect(unknown.Piece(1, true, 4, 6, 3, 5), absl::StatusCode::kNotFound,
         "sample \"nope\" is not in pool \"p\": piece 1 extends");
  // Rows must continue exactly where the stored ones end (never replace).
  expect(r.Piece(1, true, 4, 6, 2, 5), absl::StatusCode::kInvalidArgument,
         "routed_experts_row_offset is 2; the stored rows end at 3");
  expect(r.Piece(1, true, 4, 6, 4, 5), absl::StatusCode::kInvalidArgument,
         "routed_experts_row_offset is 4; the stored rows end at 3");
  // Sealing requires rows ending at n or n - 1 of the whole sample.
  expect(r.Piece(1, false, 4, 10, 3, 7), absl::StatusCode::kInvalidArgument,
         "rows ending at 7; they must end at n = 10 or n - 1 = 9");
  expect(r.Piece(1, true, 4, 6, 3, 7), absl::StatusCode::kInvalidArgument,
         "ending at 7, past the sample's 6 tokens");
  v1::Sample other_group = r.Piece(1, true, 4, 6, 3, 5);
  other_group.set_group_id("h");
  expect(other_group, absl::StatusCode::kInvalidArgument,
         "sample \"s\" piece 1: group_id is \"h\", piece 0 set \"g\"");
  v1::Sample other_scalar = r.Piece(1, true, 4, 6, 3, 5);
  (*other_scalar.mutable_scalars())["reward"] = 2;
  expect(other_scalar, absl::StatusCode::kInvalidArgument,
         "scalars[\"reward\"] is 2, the sample has 1.5");
  v1::Sample no_field = r.Piece(1, true, 4, 6, 3, 5);
  no_field.mutable_token_fields()->clear();
  expect(no_field, absl::StatusCode::kInvalidArgument, "token_fields[\"logprobs\"] is missing");
  // Repeating piece 0's group and scalars identically is fine.
  v1::Sample repeats = r.Piece(1, true, 4, 6, 3, 5);
  repeats.set_group_id("g");
  repeats.set_group_size(1);
  (*repeats.mutable_scalars())["reward"] = 1.5;
  EXPECT_TRUE(PutMessage(store_, repeats).ok());
}

TEST_F(SamplePiecesTest, APieceMaySealWithoutNewTokensAndVersionIsTheOldest) {
  const Rollout r{"s", 6, 6};
  ASSERT_TRUE(PutMessage(store_, r.Piece(0, true, 0, 6, 0, 5, /*version=*/3)).ok());
  // The last row arrives on its own, with the seal (no new tokens).
  ASSERT_TRUE(PutMessage(store_, r.Piece(1, false, 6, 6, 5, 6, /*version=*/4)).ok());
  absl::StatusOr<StoredSample> taken = Taken(store_, "s");
  ASSERT_TRUE(taken.ok()) << taken.status();
  ExpectSameContent(*taken, *ValidateSample(r.Whole(/*version=*/3), Model()));
}

TEST(SamplePieces, AllZeroLayerIsCheckedOverTheSealedSample) {
  // topk 1: MoE layer 1 is expert 0 in both rows. Each piece alone covers
  // one row (no rule); the sealed sample covers two.
  ModelSpec model = Model();
  model.topk = 1;
  SampleStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.RegisterModel("p", model).ok());
  auto put = [&](const v1::Sample& m) -> absl::Status {
    absl::StatusOr<StoredSample> v = ValidateSample(m, model);
    if (!v.ok()) return v.status();
    std::vector<StoredSample> batch{*v};
    return store.Put("p", std::move(batch)).status();
  };
  v1::Sample p0;
  p0.set_sample_id("z");
  p0.set_partial(true);
  *p0.mutable_tokens() = TestArray<int32_t>(v1::INT32, {1}, {1});
  *p0.mutable_routed_experts() = TestArray<int32_t>(v1::INT32, {1, 4, 1}, {5, 0, 2, 3});
  v1::Sample p1 = p0;
  p1.set_piece(1);
  p1.set_partial(false);
  p1.set_routed_experts_row_offset(1);
  *p1.mutable_routed_experts() = TestArray<int32_t>(v1::INT32, {1, 4, 1}, {5, 0, 4, 6});
  ASSERT_TRUE(put(p0).ok());
  const absl::Status sealed = put(p1);
  EXPECT_EQ(sealed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sealed.message(),
              HasSubstr("sample \"z\" piece 1: routed_experts MoE layer 1 is 0 for all 2 covered "
                        "tokens of the sealed sample"));
  EXPECT_EQ(store.GetPool("p")->num_open_samples, 1);
  // With the model's permission it seals.
  model.allow_all_zero_layers = true;
  SampleStore allowed(int64_t{1} << 30);
  ASSERT_TRUE(allowed.RegisterModel("p", model).ok());
  for (const v1::Sample* m : {&p0, &p1}) {
    std::vector<StoredSample> batch{*ValidateSample(*m, model)};
    ASSERT_TRUE(allowed.Put("p", std::move(batch)).ok());
  }
  EXPECT_EQ(allowed.GetPool("p")->num_free_samples, 1);
}

TEST_F(SamplePiecesTest, AZeroRowPayloadSaysWhereTheRowsEnd) {
  const Rollout r{"s", 4, 3};
  ASSERT_TRUE(PutMessage(store_, r.Piece(0, true, 0, 3, 0, 3)).ok());
  // An explicit empty payload is a payload (layout.md section 1): it must
  // continue the stored rows.
  v1::Sample wrong = r.Piece(1, false, 3, 4, 0, 0);
  *wrong.mutable_routed_experts() = TestArray<int32_t>(v1::INT32, {0, 4, 2}, {});
  wrong.set_routed_experts_row_offset(2);
  absl::StatusOr<PutResult> refused = PutMessage(store_, wrong);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("routed_experts_row_offset is 2; the stored rows end at 3"));
  v1::Sample right = wrong;
  right.set_routed_experts_row_offset(3);
  ASSERT_TRUE(PutMessage(store_, right).ok());
  EXPECT_EQ(PutMessage(store_, right)->duplicates, 1);
  EXPECT_EQ(PutMessage(store_, r.Piece(1, false, 3, 4, 0, 0)).status().code(),
            absl::StatusCode::kAlreadyExists);  // the same piece without its payload differs
  absl::StatusOr<StoredSample> taken = Taken(store_, "s");
  ASSERT_TRUE(taken.ok()) << taken.status();
  ExpectSameContent(*taken, *ValidateSample(r.Whole(), Model()));
}

TEST(SamplePieces, ADenseModelsPiecesMakeTheWholeSample) {
  ModelSpec dense;
  dense.name = "dense";
  dense.num_layers = 4;
  SampleStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.RegisterModel("p", dense).ok());
  const Rollout r{"d", 9, 0};
  int64_t bytes_before_seal = 0;
  for (int k = 0; k < 3; ++k) {
    absl::StatusOr<StoredSample> v =
        ValidateSample(r.Piece(k, k < 2, 3 * k, 3 * k + 3, 0, 0), dense);
    ASSERT_TRUE(v.ok()) << v.status();
    std::vector<StoredSample> batch{*std::move(v)};
    ASSERT_TRUE(store.Put("p", std::move(batch)).ok());
    if (k == 1) bytes_before_seal = store.GetPool("p")->stored_bytes;
  }
  EXPECT_GT(store.GetPool("p")->stored_bytes, bytes_before_seal);
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep("x", "p", {"d"}, 0, Topo());
  ASSERT_TRUE(step.ok()) << step.status();
  const StoredSample& taken = *(*step)->samples[0];
  const StoredSample whole = *ValidateSample(r.Whole(), dense);
  ExpectSameContent(taken, whole);
  EXPECT_TRUE(taken.row_valid.empty());
  ASSERT_TRUE(store.ReleaseStep("x").ok());
  EXPECT_EQ(store.GetPool("p")->stored_bytes, 0);
}

TEST_F(SamplePiecesTest, MemoryLimitCountsEachPiece) {
  const Rollout r{"s", 1000, 999};
  SampleStore small(8000);
  ASSERT_TRUE(small.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(PutMessage(small, r.Piece(0, true, 0, 100, 0, 99)).ok());
  const int64_t after_first = small.GetPool("p")->stored_bytes;
  EXPECT_GT(after_first, 100 * (4 + 6 + 1 + 4));
  // A piece that makes its sample larger than the limit can never fit: not
  // a code a producer retries.
  absl::StatusOr<PutResult> never = PutMessage(small, r.Piece(1, true, 100, 1000, 99, 999));
  EXPECT_EQ(never.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(never.status().message(),
              HasSubstr("more than --max-memory 8000: it can never be stored"));
  EXPECT_EQ(small.GetPool("p")->stored_bytes, after_first);
  // One that would fit alone but not beside another sample waits for a release.
  const Rollout other{"o", 250, 249, "h"};
  ASSERT_TRUE(PutMessage(small, other.Whole()).ok());
  absl::StatusOr<PutResult> later = PutMessage(small, r.Piece(1, true, 100, 300, 99, 299));
  EXPECT_EQ(later.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(small.CreateStep("y", "p", {"o"}, 0, Topo()).ok());
  ASSERT_TRUE(small.ReleaseStep("y").ok());
  ASSERT_TRUE(PutMessage(small, r.Piece(1, true, 100, 300, 99, 299)).ok());
  // Released with its step, the sealed sample frees everything its pieces took.
  ASSERT_TRUE(PutMessage(small, r.Piece(2, false, 300, 301, 299, 300)).ok());
  ASSERT_TRUE(small.CreateStep("x", "p", {"s"}, 0, Topo()).ok());
  ASSERT_TRUE(small.ReleaseStep("x").ok());
  EXPECT_EQ(small.GetPool("p")->stored_bytes, 0);
  EXPECT_EQ(small.Stats().stored_bytes, 0);
}

TEST(SamplePiecesDurable, OpenAndSealedSamplesSurviveReopenAndCompaction) {
  TempDir dir;
  const Rollout a{"a", 9, 8};
  const Rollout b{"b", 7, 6, "h"};
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(d->store->RegisterModel("p", Model()).ok());
    ASSERT_TRUE(PutMessage(*d->store, a.Piece(0, true, 0, 4, 0, 3)).ok());
    ASSERT_TRUE(PutMessage(*d->store, a.Piece(1, false, 4, 9, 3, 8)).ok());
    ASSERT_TRUE(PutMessage(*d->store, b.Piece(0, true, 0, 3, 0, 2)).ok());
  }
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    const PoolStats pool = *d->store->GetPool("p");
    EXPECT_EQ(pool.num_free_samples, 1) << "round " << round;
    EXPECT_EQ(pool.num_open_samples, 1) << "round " << round;
    // Re-sends are still recognised; the open sample goes on where it was.
    EXPECT_EQ(PutMessage(*d->store, a.Piece(1, false, 4, 9, 3, 8))->duplicates, 1);
    EXPECT_EQ(PutMessage(*d->store, b.Piece(0, true, 0, 3, 0, 2))->duplicates, 1);
    EXPECT_EQ(PutMessage(*d->store, b.Piece(2, true, 3, 4, 2, 3)).status().code(),
              absl::StatusCode::kFailedPrecondition);
    if (round == 0) {
      ASSERT_TRUE(d->store->CompactLog().ok());
    }
  }
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(PutMessage(*d->store, b.Piece(1, false, 3, 7, 2, 6)).ok());
  absl::StatusOr<StoredSample> taken_a = Taken(*d->store, "a");
  absl::StatusOr<StoredSample> taken_b = Taken(*d->store, "b");
  ASSERT_TRUE(taken_a.ok() && taken_b.ok());
  ExpectSameContent(*taken_a, *ValidateSample(a.Whole(), Model()));
  ExpectSameContent(*taken_b, *ValidateSample(b.Whole(), Model()));
}

TEST(SamplePiecesDurable, ADroppedIncompleteGroupTakesItsOpenSamples) {
  TempDir dir;
  PoolOptions options;
  options.incomplete_group_timeout_ms = 1;
  Rollout sealed{"x", 4, 3};
  Rollout open{"y", 4, 3};
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(d->store->RegisterModel("p", Model(), options).ok());
    v1::Sample x = sealed.Whole();
    x.set_group_size(3);
    v1::Sample y = open.Piece(0, true, 0, 2, 0, 1);
    y.set_group_size(3);
    ASSERT_TRUE(PutMessage(*d->store, x).ok());
    ASSERT_TRUE(PutMessage(*d->store, y).ok());
    absl::StatusOr<DropResult> dropped =
        d->store->DropExpiredGroups(absl::Now() + absl::Seconds(1));
    ASSERT_TRUE(dropped.ok());
    EXPECT_EQ(dropped->groups, 1);
    EXPECT_EQ(dropped->group_samples, 2);
    EXPECT_EQ(d->store->GetPool("p")->num_open_samples, 0);
    EXPECT_EQ(d->store->GetPool("p")->stored_bytes, 0);
  }
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->store->GetPool("p")->num_open_samples, 0);
  EXPECT_EQ(d->store->GetPool("p")->num_incomplete_groups_dropped, 1);
  // Its next piece finds nothing to extend.
  EXPECT_EQ(PutMessage(*d->store, open.Piece(1, false, 2, 4, 1, 3)).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rollpack
