// Ragged per-token fields (layout.md section 13) validated as ingest
// validates them and stored: the pool's names fixed by its first sample,
// pieces appending their lists, identical re-sends, memory accounting, and
// the durable log (and compaction) keeping them.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ingest/sample_validation.h"
#include "server/store/log_records.h"
#include "server/store/sample_store.h"
#include "testing/durable_store.h"
#include "testing/ndarrays.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// Dense, V = 1000: ids stored as uint16.
ModelSpec Model() {
  ModelSpec m;
  m.name = "m";
  m.num_layers = 2;
  m.vocab_size = 1000;
  return m;
}

// Token i's kept ids: i % 4 of them (token 0, 4, ...: an empty list).
std::vector<int32_t> Kept(int64_t i) {
  std::vector<int32_t> ids;
  for (int64_t j = 0; j < i % 4; ++j) ids.push_back(static_cast<int32_t>((i * 37 + j * 11) % 1000));
  return ids;
}

// Tokens [begin, end) of an n-token rollout `id`, as piece `piece` (-1:
// the whole sample), with `fields` ragged fields of the lists Kept().
v1::Sample Message(const std::string& id, int64_t begin, int64_t end, int piece = -1,
                   bool partial = false, std::vector<std::string> fields = {"sampling_mask"}) {
  v1::Sample s;
  s.set_sample_id(id);
  if (piece >= 0) {
    s.set_piece(piece);
    s.set_partial(partial);
  }
  std::vector<int32_t> tokens, values;
  std::vector<int64_t> offsets = {0};
  for (int64_t i = begin; i < end; ++i) {
    tokens.push_back(static_cast<int32_t>(100 + i));
    for (int32_t v : Kept(i)) values.push_back(v);
    offsets.push_back(static_cast<int64_t>(values.size()));
  }
  if (end > begin) *s.mutable_tokens() = TestArray(v1::INT32, tokens);
  for (const std::string& name : fields) {
    v1::RaggedArray& field = (*s.mutable_ragged_token_fields())[name];
    *field.mutable_values() = TestArray(v1::INT32, values);
    *field.mutable_offsets() = TestArray(v1::INT64, offsets);
  }
  return s;
}

absl::StatusOr<PutResult> Put(SampleStore& store, const v1::Sample& message,
                              const std::string& pool = "p") {
  absl::StatusOr<StoredSample> validated = ValidateSample(message, Model());
  if (!validated.ok()) return validated.status();
  std::vector<StoredSample> batch;
  batch.push_back(*std::move(validated));
  return store.Put(pool, std::move(batch));
}

// The sample as a step holds it (released again: it stays in the pool).
absl::StatusOr<StoredSample> Taken(SampleStore& store, const std::string& id) {
  static int step = 0;
  const std::string step_id = absl::StrCat("take-", step++);
  Topology topology;
  topology.max_tokens_per_rank = 1 << 16;
  StepRequest request;
  request.step_id = step_id;
  request.pool = "p";
  request.sample_ids = {id};
  request.topology = topology;
  request.reuse_samples = true;
  absl::StatusOr<std::shared_ptr<const Step>> created = store.CreateStep(request);
  if (!created.ok()) return created.status();
  StoredSample copy = *(*created)->samples.at(0);
  if (absl::Status released = store.ReleaseStep(step_id).status(); !released.ok()) return released;
  return copy;
}

class RaggedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(store_.RegisterModel("p", Model()).ok()); }
  SampleStore store_{int64_t{1} << 30};
};

TEST_F(RaggedStoreTest, TheFirstSampleFixesThePoolsRaggedNames) {
  ASSERT_TRUE(Put(store_, Message("a", 0, 6)).ok());
  absl::StatusOr<PutResult> missing = Put(store_, Message("b", 0, 6, -1, false, {}));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("sample \"b\": ragged_token_fields[\"sampling_mask\"] is missing "
                        "(every sample of the pool carries it)"));
  absl::StatusOr<PutResult> other =
      Put(store_, Message("c", 0, 6, -1, false, {"sampling_mask", "top_k"}));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(),
              HasSubstr("sample \"c\": ragged_token_fields[\"top_k\"] is not among the pool's "
                        "ragged fields {sampling_mask} (fixed by its first sample)"));
  EXPECT_EQ(store_.GetPool("p")->num_samples, 1);

  // A pool whose first sample had none takes none.
  ASSERT_TRUE(store_.RegisterModel("q", Model()).ok());
  ASSERT_TRUE(Put(store_, Message("a", 0, 6, -1, false, {}), "q").ok());
  absl::StatusOr<PutResult> refused = Put(store_, Message("b", 0, 6), "q");
  EXPECT_THAT(refused.status().message(), HasSubstr("is not among the pool's ragged fields {}"));
}

TEST_F(RaggedStoreTest, ABatchsFirstSampleFixesTheNamesForTheBatch) {
  std::vector<StoredSample> batch;
  batch.push_back(*ValidateSample(Message("a", 0, 5), Model()));
  batch.push_back(*ValidateSample(Message("b", 0, 5, -1, false, {}), Model()));
  absl::StatusOr<PutResult> put = store_.Put("p", std::move(batch));
  EXPECT_THAT(put.status().message(), HasSubstr("sample \"b\": ragged_token_fields[\"sampling_mask\"] is missing"));
  EXPECT_EQ(store_.GetPool("p")->num_samples, 0) << "all or nothing";
}

TEST(RaggedStore, APoolThatDeclaredItsTokenFieldsTakesRaggedNamesFromItsFirstSample) {
  SampleStore store(int64_t{1} << 30);
  PoolOptions options;
  options.token_fields.push_back(DeclaredTokenField{"loss_mask", v1::UINT8, {}, false});
  ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
  v1::Sample first = Message("a", 0, 3);
  (*first.mutable_token_fields())["loss_mask"] = TestArray(v1::UINT8, std::vector<uint8_t>{1, 1, 0});
  absl::StatusOr<StoredSample> validated = ValidateSample(first, Model(), options.token_fields);
  ASSERT_TRUE(validated.ok()) << validated.status();
  std::vector<StoredSample> batch{*validated};
  ASSERT_TRUE(store.Put("p", std::move(batch)).ok());
  v1::Sample second = Message("b", 0, 3, -1, false, {});
  (*second.mutable_token_fields())["loss_mask"] = TestArray(v1::UINT8, std::vector<uint8_t>{1, 1, 0});
  std::vector<StoredSample> without{*ValidateSample(second, Model(), options.token_fields)};
  EXPECT_THAT(store.Put("p", std::move(without)).status().message(),
              HasSubstr("ragged_token_fields[\"sampling_mask\"] is missing"));
}

TEST_F(RaggedStoreTest, IdenticalResendsAreDuplicatesOtherListsAreRefused) {
  ASSERT_TRUE(Put(store_, Message("a", 0, 6)).ok());
  absl::StatusOr<PutResult> again = Put(store_, Message("a", 0, 6));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->duplicates, 1);
  v1::Sample changed = Message("a", 0, 6);
  int32_t other = 999;
  std::memcpy((*changed.mutable_ragged_token_fields())["sampling_mask"].mutable_values()->mutable_data()->data(),
              &other, 4);
  EXPECT_EQ(Put(store_, changed).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(RaggedStoreTest, StoredBytesCountTheIdsAndEightBytesPerOffset) {
  const StoredSample with = *ValidateSample(Message("a", 0, 4000), Model());
  const StoredSample without = *ValidateSample(Message("a", 0, 4000, -1, false, {}), Model());
  const StoredRagged& mask = with.ragged_fields.at("sampling_mask");
  EXPECT_EQ(mask.values.size(), 2 * 6000u) << "1.5 ids per token, uint16";
  const int64_t extra = SampleStore::MemoryBytes(with) - SampleStore::MemoryBytes(without);
  const int64_t arrays = static_cast<int64_t>(mask.values.size() + 8 * mask.offsets.size());
  EXPECT_GE(extra, arrays);
  EXPECT_LE(extra, arrays + 256) << "plus a map node, the name and malloc's headers";
  absl::StatusOr<PutResult> put = Put(store_, Message("a", 0, 4000));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->stored_bytes, SampleStore::MemoryBytes(with));
  EXPECT_EQ(store_.GetPool("p")->stored_bytes, SampleStore::MemoryBytes(with));
  // A limit the lists push it past refuses it.
  SampleStore small(SampleStore::MemoryBytes(without) + 1000);
  ASSERT_TRUE(small.RegisterModel("p", Model()).ok());
  EXPECT_EQ(Put(small, Message("a", 0, 4000)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RaggedStoreTest, PiecesAppendTheirListsToTheSamplesField) {
  std::mt19937 rng(7);
  int64_t lists = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const std::string id = absl::StrCat("s", trial);
    const int64_t n = 1 + static_cast<int64_t>(rng() % 40);
    std::vector<int64_t> cuts = {0};
    while (cuts.back() < n) cuts.push_back(std::min<int64_t>(n, cuts.back() + 1 + rng() % 9));
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const bool last = k + 2 == cuts.size();
      absl::StatusOr<PutResult> put =
          Put(store_, Message(id, cuts[k], cuts[k + 1], static_cast<int>(k), !last));
      ASSERT_TRUE(put.ok()) << put.status();
    }
    absl::StatusOr<StoredSample> taken = Taken(store_, id);
    ASSERT_TRUE(taken.ok()) << taken.status();
    EXPECT_EQ(taken->ragged_fields, ValidateSample(Message(id, 0, n), Model())->ragged_fields)
        << "trial " << trial;
    const StoredRagged& mask = taken->ragged_fields.at("sampling_mask");
    lists += static_cast<int64_t>(mask.values.size() + 8 * mask.offsets.size());
  }
  EXPECT_GT(store_.GetPool("p")->stored_bytes, lists);
  // Released, the samples give back exactly what their pieces added.
  Topology topology;
  topology.max_tokens_per_rank = 1 << 16;
  ASSERT_TRUE(store_.CreateStep("all", "p", {}, 20, topology).ok());
  ASSERT_TRUE(store_.ReleaseStep("all").ok());
  EXPECT_EQ(store_.GetPool("p")->stored_bytes, 0);
  EXPECT_EQ(store_.Stats().stored_bytes, 0);
}

TEST_F(RaggedStoreTest, PieceRefusalsAndResends) {
  ASSERT_TRUE(Put(store_, Message("s", 0, 5, 0, true)).ok());
  EXPECT_THAT(Put(store_, Message("s", 5, 8, 1, true, {})).status().message(),
              HasSubstr("sample \"s\" piece 1: ragged_token_fields[\"sampling_mask\"] is missing "
                        "(piece 0 sent it; every piece with tokens carries their lists)"));
  EXPECT_THAT(Put(store_, Message("s", 5, 8, 1, true, {"sampling_mask", "x"})).status().message(),
              HasSubstr("sample \"s\" piece 1: ragged_token_fields[\"x\"] was not in piece 0"));
  ASSERT_TRUE(Put(store_, Message("s", 5, 8, 1, true)).ok());
  EXPECT_EQ(Put(store_, Message("s", 5, 8, 1, true))->duplicates, 1);
  EXPECT_EQ(Put(store_, Message("s", 0, 5, 0, true))->duplicates, 1);
  // Piece 1 again with other lists (token 5's moved to token 6).
  v1::Sample changed = Message("s", 5, 8, 1, true);
  *(*changed.mutable_ragged_token_fields())["sampling_mask"].mutable_offsets() =
      TestArray(v1::INT64, std::vector<int64_t>{0, 0, 3, 6});
  EXPECT_EQ(Put(store_, changed).status().code(), absl::StatusCode::kAlreadyExists);
  // A piece that only seals carries no lists.
  ASSERT_TRUE(Put(store_, Message("s", 8, 8, 2, false, {})).ok());
  absl::StatusOr<StoredSample> taken = Taken(store_, "s");
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->ragged_fields, ValidateSample(Message("s", 0, 8), Model())->ragged_fields);
}

TEST(RaggedStoreDurable, RaggedFieldsSurviveReopenAndCompaction) {
  TempDir dir;
  int64_t stored_bytes = 0;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(d->store->RegisterModel("p", Model()).ok());
    ASSERT_TRUE(Put(*d->store, Message("whole", 0, 9)).ok());
    ASSERT_TRUE(Put(*d->store, Message("sealed", 0, 4, 0, true)).ok());
    ASSERT_TRUE(Put(*d->store, Message("sealed", 4, 7, 1, false)).ok());
    ASSERT_TRUE(Put(*d->store, Message("open", 0, 3, 0, true)).ok());
    stored_bytes = d->store->GetPool("p")->stored_bytes;
  }
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    const PoolStats pool = *d->store->GetPool("p");
    EXPECT_EQ(pool.num_free_samples, 2) << "round " << round;
    EXPECT_EQ(pool.num_open_samples, 1) << "round " << round;
    // Replayed piece by piece, the buffers grow as they did (compaction
    // writes a sealed sample whole, sized exactly).
    if (round == 0) {
      EXPECT_EQ(pool.stored_bytes, stored_bytes);
    }
    EXPECT_EQ(Put(*d->store, Message("whole", 0, 9))->duplicates, 1);
    EXPECT_EQ(Put(*d->store, Message("open", 0, 3, 0, true))->duplicates, 1);
    // The recovered pool still holds its names.
    EXPECT_THAT(Put(*d->store, Message("new", 0, 2, -1, false, {})).status().message(),
                HasSubstr("ragged_token_fields[\"sampling_mask\"] is missing"));
    if (round == 0) {
      ASSERT_TRUE(d->store->CompactLog().ok());
    }
  }
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(Put(*d->store, Message("open", 3, 5, 1, false)).ok());
  for (const auto& [id, n] : {std::make_pair("whole", 9), std::make_pair("sealed", 7),
                              std::make_pair("open", 5)}) {
    absl::StatusOr<StoredSample> taken = Taken(*d->store, id);
    ASSERT_TRUE(taken.ok()) << taken.status();
    EXPECT_EQ(taken->ragged_fields, ValidateSample(Message(id, 0, n), Model())->ragged_fields) << id;
  }
}

TEST(RaggedLogRecords, OnlySamplesWithRaggedFieldsUseTheNewRecordType) {
  const StoredSample plain = *ValidateSample(Message("a", 0, 3, -1, false, {}), Model());
  const StoredSample masked = *ValidateSample(Message("b", 0, 3), Model());
  EXPECT_EQ(SamplesRecordType(absl::MakeConstSpan(&plain, 1)), RecordType::kPutSamples);
  const std::vector<StoredSample> both = {plain, masked};
  const RecordType type = SamplesRecordType(absl::MakeConstSpan(both));
  EXPECT_EQ(type, RecordType::kRaggedSamples);
  EXPECT_EQ(static_cast<int64_t>(EncodeSamples("p", absl::MakeConstSpan(&masked, 1), type).size()),
            8 + 1 + 4 + EncodedSampleBytes(masked))
      << "EncodedSampleBytes is exact for a record of a sample with ragged fields";
  const std::string encoded = EncodeSamples("p", absl::MakeConstSpan(both), type);
  std::string pool;
  std::vector<StoredSample> decoded;
  ASSERT_TRUE(DecodeSamples(encoded, &pool, &decoded, type).ok());
  ASSERT_EQ(decoded.size(), 2u);
  EXPECT_EQ(decoded[1].ragged_fields, masked.ragged_fields);
  EXPECT_TRUE(decoded[0].ragged_fields.empty());
  // Offsets that do not end at the ids held are corrupt, not delivered.
  StoredSample broken = masked;
  broken.ragged_fields.at("sampling_mask").offsets.back() += 1;
  decoded.clear();
  EXPECT_EQ(DecodeSamples(EncodeSamples("p", absl::MakeConstSpan(&broken, 1), type), &pool,
                          &decoded, type)
                .code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace rollpack
