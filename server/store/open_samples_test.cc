#include "server/store/open_samples.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Two MoE layers of 8 experts, top 2: a stored row is 2 * 2 one-byte ids.
constexpr int64_t kRowBytes = 4;

ModelSpec Moe() {
  ModelSpec model;
  model.name = "m";
  model.num_layers = 2;
  model.num_experts = 8;
  model.topk = 2;
  return model;
}

// A piece of sample `id`: `tokens` with a float32 "logprobs" row each, and
// (with `rows_sent`) `rows` routed rows from `rows_begin`, every id nonzero
// (`zero_layer` >= 0: that layer's ids 0).
StoredSample Piece(const std::string& id, int32_t index, bool partial, std::vector<int32_t> tokens,
                   int64_t rows_begin = 0, int64_t rows = 0, bool rows_sent = true,
                   int zero_layer = -1) {
  StoredSample piece;
  piece.sample_id = id;
  piece.policy_version = 3;
  piece.token_fields["logprobs"] =
      StoredField{v1::FLOAT32, {}, std::string(4 * tokens.size(), static_cast<char>(index + 1))};
  piece.tokens = std::move(tokens);
  for (int64_t r = 0; r < rows; ++r) {
    for (int layer = 0; layer < 2; ++layer) {
      const char expert = layer == zero_layer ? 0 : static_cast<char>(1 + (r + layer) % 7);
      piece.experts += std::string(2, expert);
    }
    piece.row_valid.push_back(1);
  }
  piece.piece_message = PieceMessage{index, partial, rows_begin, rows_sent};
  return piece;
}

// Plans and applies `piece`, expecting `action`; the bytes it added.
// `exact_plan`: the plan counted them (all but a sealing piece's new
// scalars).
int64_t Store(OpenSamples& open, const ModelSpec& model, StoredSample piece,
              OpenSamples::Action action, std::optional<StoredSample>* sealed = nullptr,
              bool exact_plan = true) {
  absl::StatusOr<OpenSamples::Plan> plan = open.PlanPiece("p", model, piece, nullptr, nullptr);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return 0;
  EXPECT_EQ(plan->action, action);
  OpenSamples::Applied applied = open.ApplyPiece(*plan, std::move(piece), model);
  if (exact_plan) {
    EXPECT_EQ(applied.added_bytes, plan->new_bytes);
  }
  if (sealed != nullptr) *sealed = std::move(applied.sealed);
  return applied.added_bytes;
}

absl::Status PlanError(const OpenSamples& open, const ModelSpec& model, const StoredSample& piece,
                       const StoredSample* sealed = nullptr,
                       const ScalarAnnotation* pending = nullptr) {
  return open.PlanPiece("p", model, piece, sealed, pending).status();
}

TEST(OpenSamplesTest, OpensExtendsAndSealsCountingTheStoresBytes) {
  OpenSamples open(&SampleStore::MemoryBytes);
  const ModelSpec model = Moe();
  int64_t held =
      Store(open, model, Piece("s", 0, true, {1, 2, 3}, 0, 3), OpenSamples::Action::kOpen);
  ASSERT_TRUE(open.contains("s"));
  EXPECT_EQ(held, SampleStore::MemoryBytes(*open.Find("s")));
  held += Store(open, model, Piece("s", 1, true, {4, 5}, 3, 2), OpenSamples::Action::kExtend);
  ASSERT_NE(open.Find("s"), nullptr);
  EXPECT_EQ(held, SampleStore::MemoryBytes(*open.Find("s")));
  EXPECT_THAT(open.Find("s")->tokens, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(open.Find("s")->experts.size(), static_cast<size_t>(5 * kRowBytes));

  std::optional<StoredSample> sealed;
  held +=
      Store(open, model, Piece("s", 2, false, {6}, 5, 1), OpenSamples::Action::kExtend, &sealed);
  EXPECT_FALSE(open.contains("s"));
  EXPECT_TRUE(open.empty());
  ASSERT_TRUE(sealed.has_value());
  EXPECT_EQ(held, SampleStore::MemoryBytes(*sealed));
  EXPECT_THAT(sealed->tokens, ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_THAT(sealed->row_valid, ElementsAre(1, 1, 1, 1, 1, 1));
  EXPECT_EQ(sealed->token_fields.at("logprobs").data.size(), 24u);
  ASSERT_EQ(sealed->pieces.size(), 3u);
  EXPECT_FALSE(sealed->pieces.back().partial);
  EXPECT_EQ(sealed->pieces.back().token_end, 6);
  EXPECT_GT(sealed->logged_bytes, 0);
  // The piece that seals sizes the buffers exactly.
  EXPECT_EQ(sealed->tokens.capacity(), 6u);
}

TEST(OpenSamplesTest, AResentPieceIsADuplicateOrNamesTheSample) {
  OpenSamples open(&SampleStore::MemoryBytes);
  const ModelSpec model = Moe();
  Store(open, model, Piece("s", 0, true, {1, 2}, 0, 2), OpenSamples::Action::kOpen);
  Store(open, model, Piece("s", 1, true, {3}, 2, 1), OpenSamples::Action::kExtend);
  const int64_t held = SampleStore::MemoryBytes(*open.Find("s"));
  for (const StoredSample& again :
       {Piece("s", 0, true, {1, 2}, 0, 2), Piece("s", 1, true, {3}, 2, 1)}) {
    absl::StatusOr<OpenSamples::Plan> plan = open.PlanPiece("p", model, again, nullptr, nullptr);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->action, OpenSamples::Action::kDuplicate);
    EXPECT_EQ(plan->new_bytes, 0);
    EXPECT_EQ(open.ApplyPiece(*plan, again, model).added_bytes, 0);
  }
  EXPECT_EQ(SampleStore::MemoryBytes(*open.Find("s")), held);
  EXPECT_THAT(open.Find("s")->tokens, ElementsAre(1, 2, 3));

  absl::Status other = PlanError(open, model, Piece("s", 1, true, {9}, 2, 1));
  EXPECT_EQ(other.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(other.message(), "sample \"s\" already exists in pool \"p\" with a different piece 1");
}

TEST(OpenSamplesTest, PiecesComeInOrderAndOnlyAnOpenSampleIsExtended) {
  OpenSamples open(&SampleStore::MemoryBytes);
  const ModelSpec model = Moe();
  absl::Status unknown = PlanError(open, model, Piece("s", 1, true, {3}, 0, 1));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("sample \"s\" is not in pool \"p\": piece 1 extends"));

  Store(open, model, Piece("s", 0, true, {1}, 0, 1), OpenSamples::Action::kOpen);
  absl::Status skipped = PlanError(open, model, Piece("s", 2, true, {3}, 1, 1));
  EXPECT_EQ(skipped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(skipped.message(),
            "sample \"s\" has 1 pieces stored; the next is piece 1, got piece 2");

  // A sample sent whole (or sealed) takes no piece.
  StoredSample whole = Piece("w", 0, false, {1, 2}, 0, 2);
  whole.piece_message.reset();
  absl::Status sealed = PlanError(open, model, Piece("w", 1, true, {3}, 2, 1), &whole);
  EXPECT_EQ(sealed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sealed.message(), "sample \"w\" is sealed (1 pieces); piece 1 cannot extend it");
  absl::Status first = PlanError(open, model, Piece("w", 0, true, {1, 2}, 0, 2), &whole);
  EXPECT_EQ(first.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(first.message(), HasSubstr("with a different piece 0 (it was sent whole)"));
}

TEST(OpenSamplesTest, TheSealingPieceEndsTheRowsAtNOrNMinusOne) {
  const ModelSpec model = Moe();
  for (int64_t rows_end : {4, 5}) {
    OpenSamples open(&SampleStore::MemoryBytes);
    Store(open, model, Piece("s", 0, true, {1, 2, 3}, 0, 3), OpenSamples::Action::kOpen);
    std::optional<StoredSample> sealed;
    Store(open, model, Piece("s", 1, false, {4, 5}, 3, rows_end - 3), OpenSamples::Action::kExtend,
          &sealed);
    ASSERT_TRUE(sealed.has_value()) << "rows ending at " << rows_end;
    EXPECT_EQ(sealed->pieces.back().rows_end, rows_end);
  }
  OpenSamples open(&SampleStore::MemoryBytes);
  Store(open, model, Piece("s", 0, true, {1, 2, 3}, 0, 3), OpenSamples::Action::kOpen);
  absl::Status short_rows = PlanError(open, model, Piece("s", 1, false, {4, 5}, 3, 0));
  EXPECT_EQ(short_rows.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(short_rows.message(),
            "sample \"s\" piece 1: seals the sample with routed_experts rows ending at 3; they "
            "must end at n = 5 or n - 1 = 4");
  absl::Status past = PlanError(open, model, Piece("s", 1, false, {4, 5}, 3, 3));
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.message(), HasSubstr("ending at 6, past the sample's 5 tokens"));
  absl::Status gap = PlanError(open, model, Piece("s", 1, false, {4, 5}, 2, 2));
  EXPECT_EQ(gap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gap.message(), HasSubstr("routed_experts_row_offset is 2; the stored rows end at 3"));

  OpenSamples no_rows(&SampleStore::MemoryBytes);
  Store(no_rows, model, Piece("s", 0, true, {1}, 0, 0, /*rows_sent=*/false),
        OpenSamples::Action::kOpen);
  absl::Status none =
      PlanError(no_rows, model, Piece("s", 1, false, {2}, 0, 0, /*rows_sent=*/false));
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(), HasSubstr("no piece carried routed_experts rows"));
}

TEST(OpenSamplesTest, ALaterPieceCarriesPieceZerosTokenFields) {
  OpenSamples open(&SampleStore::MemoryBytes);
  const ModelSpec model = Moe();
  Store(open, model, Piece("s", 0, true, {1}, 0, 1), OpenSamples::Action::kOpen);
  StoredSample missing = Piece("s", 1, true, {2}, 1, 1);
  missing.token_fields.clear();
  absl::Status status = PlanError(open, model, missing);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "sample \"s\" piece 1: token_fields[\"logprobs\"] is missing (piece 0 sent it; every "
            "piece with tokens carries its rows)");
  StoredSample extra = Piece("s", 1, true, {2}, 1, 1);
  extra.token_fields["values"] = extra.token_fields.at("logprobs");
  EXPECT_THAT(PlanError(open, model, extra).message(),
              HasSubstr("token_fields[\"values\"] was not in piece 0"));
}

TEST(OpenSamplesTest, ALayerZeroForEveryCoveredRowIsRefusedAtSeal) {
  ModelSpec model = Moe();
  OpenSamples open(&SampleStore::MemoryBytes);
  // Layer 1 is 0 in every row, over both pieces: only the seal sees it.
  Store(open, model, Piece("s", 0, true, {1, 2}, 0, 2, true, /*zero_layer=*/1),
        OpenSamples::Action::kOpen);
  const StoredSample seal = Piece("s", 1, false, {3, 4}, 2, 2, true, /*zero_layer=*/1);
  absl::Status status = PlanError(open, model, seal);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "sample \"s\" piece 1: routed_experts MoE layer 1 is 0 for all 4 covered tokens of "
            "the sealed sample: a broken capture (register the model with allow_all_zero_layers "
            "to accept it)");
  // A nonzero id in that layer in either piece makes it a real layer.
  EXPECT_TRUE(PlanError(open, model, Piece("s", 1, false, {3, 4}, 2, 2)).ok());
  model.allow_all_zero_layers = true;
  EXPECT_TRUE(PlanError(open, model, seal).ok());
}

TEST(OpenSamplesTest, GroupAndScalarsRepeatPieceZeroAndOnlyTheSealAddsOne) {
  OpenSamples open(&SampleStore::MemoryBytes);
  const ModelSpec model = Moe();
  StoredSample first = Piece("s", 0, true, {1}, 0, 1);
  first.group_id = "g1";
  first.group_size = 2;
  first.scalars["reward"] = 1;
  Store(open, model, std::move(first), OpenSamples::Action::kOpen);
  StoredSample group = Piece("s", 1, true, {2}, 1, 1);
  group.group_id = "g2";
  absl::Status moved = PlanError(open, model, group);
  EXPECT_EQ(moved.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(moved.message(), "sample \"s\" piece 1: group_id is \"g2\", piece 0 set \"g1\"");
  StoredSample other = Piece("s", 1, true, {2}, 1, 1);
  other.scalars["reward"] = 2;
  EXPECT_THAT(PlanError(open, model, other).message(),
              HasSubstr("scalars[\"reward\"] is 2, the sample has 1"));
  StoredSample early = Piece("s", 1, true, {2}, 1, 1);
  early.scalars["score"] = 3;
  EXPECT_THAT(PlanError(open, model, early).message(),
              HasSubstr("only the piece that seals it (partial = false) may add one"));
  StoredSample seal = Piece("s", 1, false, {2}, 1, 1);
  seal.scalars["score"] = 3;
  const ScalarAnnotation pending{"s", {{"score", 4}}};
  absl::Status reserved = PlanError(open, model, seal, nullptr, &pending);
  EXPECT_EQ(reserved.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(reserved.message(), HasSubstr("an annotation of this sample that sets it"));
  const int64_t before = SampleStore::MemoryBytes(*open.Find("s"));
  std::optional<StoredSample> sealed;
  const int64_t added = Store(open, model, std::move(seal), OpenSamples::Action::kExtend, &sealed,
                              /*exact_plan=*/false);
  ASSERT_TRUE(sealed.has_value());
  EXPECT_EQ(before + added, SampleStore::MemoryBytes(*sealed));
  EXPECT_EQ(sealed->scalars.at("score"), 3);
  EXPECT_THAT(sealed->later_scalars, ElementsAre("score"));
}

TEST(OpenSamplesTest, AnnotationsAndEraseReportTheBytes) {
  OpenSamples open(&SampleStore::MemoryBytes);
  const ModelSpec model = Moe();
  int64_t held = Store(open, model, Piece("s", 0, true, {1, 2}, 0, 2), OpenSamples::Action::kOpen);
  const int64_t added = open.AddScalars("s", {{"reward", 0.5}}, 100);
  EXPECT_GT(added, 0);
  held += added;
  EXPECT_EQ(held, SampleStore::MemoryBytes(*open.Find("s")));
  EXPECT_EQ(open.Find("s")->scalars.at("reward"), 0.5);
  EXPECT_EQ(open.AddScalars("s", {{"reward", 0.5}}, 0), 0);
  EXPECT_EQ(open.Erase("s"), held);
  EXPECT_FALSE(open.contains("s"));
  EXPECT_EQ(open.Erase("s"), 0);
  EXPECT_EQ(open.size(), 0u);
}

TEST(OpenSamplesTest, StateIsWhereTheOpenSampleStands) {
  OpenSamples open(&SampleStore::MemoryBytes);
  const ModelSpec model = Moe();
  EXPECT_FALSE(open.State("s").has_value());
  StoredSample first = Piece("s", 0, true, {7, 8}, 0, 1);
  first.scalars["reward"] = 1;
  first.ragged_fields["alternatives"] = StoredRagged{v1::INT32, {0, 1, 1}, std::string(4, '\1')};
  Store(open, model, std::move(first), OpenSamples::Action::kOpen);
  std::optional<OpenSampleState> state = open.State("s");
  ASSERT_TRUE(state.has_value());
  EXPECT_THAT(state->tokens, ElementsAre(7, 8));
  EXPECT_EQ(state->rows_end, 1);
  EXPECT_EQ(state->pieces, 1);
  EXPECT_EQ(state->scalars.at("reward"), 1);
  ASSERT_EQ(state->token_fields.count("logprobs"), 1u);
  EXPECT_EQ(state->token_fields.at("logprobs").dtype, v1::FLOAT32);
  EXPECT_THAT(state->ragged_fields, ElementsAre("alternatives"));

  OpenSamples no_rows(&SampleStore::MemoryBytes);
  Store(no_rows, model, Piece("t", 0, true, {1}, 0, 0, /*rows_sent=*/false),
        OpenSamples::Action::kOpen);
  EXPECT_EQ(no_rows.State("t")->rows_end, -1);
}

TEST(OpenSamplesTest, ASnapshotRestoresTheOpenSampleOnce) {
  OpenSamples open(&SampleStore::MemoryBytes);
  const ModelSpec model = Moe();
  Store(open, model, Piece("s", 0, true, {1, 2}, 0, 2), OpenSamples::Action::kOpen);
  Store(open, model, Piece("s", 1, true, {3}, 2, 1), OpenSamples::Action::kExtend);
  StoredSample snapshot = *open.Find("s");
  snapshot.piece_message.reset();
  ASSERT_TRUE(OpenSamples::IsPieceOrOpen(snapshot));
  EXPECT_EQ(PlanError(open, model, snapshot).code(), absl::StatusCode::kDataLoss);

  OpenSamples restored(&SampleStore::MemoryBytes);
  const int64_t held = Store(restored, model, snapshot, OpenSamples::Action::kRestoreOpen);
  EXPECT_EQ(held, SampleStore::MemoryBytes(*restored.Find("s")));
  EXPECT_EQ(restored.State("s")->rows_end, 3);
  // It takes the next piece where the original left off.
  Store(restored, model, Piece("s", 2, true, {4}, 3, 1), OpenSamples::Action::kExtend);
  EXPECT_THAT(restored.Find("s")->tokens, ElementsAre(1, 2, 3, 4));
}

}  // namespace
}  // namespace rollpack
