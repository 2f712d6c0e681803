// Sample validation: any wire Sample (protobuf bytes) against four models
// (uint8 ids, uint16 ids with dense layers, dense, MTP routing with dense
// layers). Oracle: an accepted sample is normalised as layout.md sections 1
// and 10 say (compact [n, |M| + D, K] at
// the narrowest width, ids < E and distinct in valid rows, zeros in missing
// rows, fields sliced like tokens), and survives the durable log's codec and
// the store unchanged. The codec's decoder also gets the raw bytes.
#include <algorithm>
#include <cstring>
#include <set>

#include "fuzz/fuzz_common.h"
#include "google/protobuf/stubs/logging.h"
#include "server/store/durable_log.h"
#include "server/store/log_records.h"
#include "server/store/sample_store.h"
#include "server/ingest/sample_validation.h"

using namespace rollpack;

namespace {

ModelSpec MakeModel(int which) {
  ModelSpec m;
  m.name = "fuzz";
  m.num_layers = 4;
  if (which == 0) {
    m.num_experts = 8;
    m.topk = 2;
  } else if (which == 1) {
    m.num_experts = 300;
    m.topk = 2;
    m.moe_layers = {1, 3};
  } else if (which == 3) {
    m.num_experts = 8;
    m.topk = 2;
    m.moe_layers = {1, 3};
    m.num_mtp_layers = 1;
    m.mtp_routing = true;
    // Ragged fields' ids checked against V and kept as uint16.
    m.vocab_size = 1000;
  }
  return m;
}

}  // namespace

// Invalid UTF-8 in string fields is a parse failure; its log line is noise.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  {
    std::string pool;
    std::vector<StoredSample> decoded;
    DecodeSamples(absl::string_view(reinterpret_cast<const char*>(data), size), &pool, &decoded)
        .IgnoreError();
    decoded.clear();
    DecodeSamples(absl::string_view(reinterpret_cast<const char*>(data), size), &pool, &decoded,
                  RecordType::kPutGroupedSamples)
        .IgnoreError();
    decoded.clear();
    DecodeSamples(absl::string_view(reinterpret_cast<const char*>(data), size), &pool, &decoded,
                  RecordType::kPieceSamples)
        .IgnoreError();
    decoded.clear();
    DecodeSamples(absl::string_view(reinterpret_cast<const char*>(data), size), &pool, &decoded,
                  RecordType::kRaggedSamples)
        .IgnoreError();
  }
  const ModelSpec model = MakeModel(data[0] % 4);
  v1::Sample sample;
  if (!sample.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  absl::StatusOr<StoredSample> stored = ValidateSample(sample, model);
  // Ingest's variant (moves bytes, uint8 fast path) agrees exactly, errors included.
  {
    v1::Sample owned = sample;
    absl::StatusOr<StoredSample> taken = ValidateAndTakeSample(&owned, model);
    FUZZ_CHECK(taken.status() == stored.status());
    FUZZ_CHECK(!taken.ok() || *taken == *stored);
  }
  if (!stored.ok()) {
    FUZZ_CHECK(stored.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!stored.status().message().empty());
    return 0;
  }
  const int64_t n = stored->num_tokens();
  // A piece (lifecycle.md section 5) keeps its own rows alone; a later
  // piece may carry no tokens.
  const bool is_piece = sample.partial() || sample.piece() != 0;
  FUZZ_CHECK(is_piece == stored->piece_message.has_value());
  FUZZ_CHECK(n >= 1 || sample.piece() > 0);
  const int64_t rows = is_piece ? static_cast<int64_t>(stored->row_valid.size()) : n;
  FUZZ_CHECK(stored->sample_id == sample.sample_id());
  FUZZ_CHECK(static_cast<int64_t>(stored->row_valid.size()) == (model.is_dense() ? stored->row_valid.size() : rows));
  if (!model.is_dense()) {
    const int64_t m = model.stored_layers();
    const int w = model.stored_id_bytes();
    FUZZ_CHECK(static_cast<int64_t>(stored->experts.size()) == rows * m * model.topk * w);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t l = 0; l < m; ++l) {
        std::set<int> ids;
        for (int k = 0; k < model.topk; ++k) {
          const size_t at = static_cast<size_t>(((r * m + l) * model.topk + k) * w);
          int id = static_cast<uint8_t>(stored->experts[at]);
          if (w == 2) id |= static_cast<uint8_t>(stored->experts[at + 1]) << 8;
          if (stored->row_valid[r]) {
            FUZZ_CHECK(id < model.num_experts);
            ids.insert(id);
          } else {
            FUZZ_CHECK(id == 0);
          }
        }
        if (stored->row_valid[r]) FUZZ_CHECK(static_cast<int>(ids.size()) == model.topk);
      }
    }
  } else {
    FUZZ_CHECK(stored->experts.empty());
  }
  for (const auto& [name, field] : stored->token_fields) {
    FUZZ_CHECK(static_cast<int64_t>(field.data.size()) == n * field.row_bytes());
  }
  // Ragged fields (layout.md section 13): one list per token, ids as stored.
  for (const auto& [name, field] : stored->ragged_fields) {
    FUZZ_CHECK(field.num_tokens() == n && field.offsets.front() == 0);
    FUZZ_CHECK(std::is_sorted(field.offsets.begin(), field.offsets.end()));
    FUZZ_CHECK(field.dtype == (model.ragged_id_bytes() == 2 ? v1::UINT16 : v1::INT32));
    FUZZ_CHECK(static_cast<int64_t>(field.values.size()) ==
               field.offsets.back() * model.ragged_id_bytes());
  }
  // The durable log's codec round-trips it exactly.
  const std::vector<StoredSample> one{*stored};
  const RecordType type = SamplesRecordType(absl::MakeConstSpan(one));
  const std::string payload = EncodeSamples("pool", absl::MakeConstSpan(one), type);
  std::string pool;
  std::vector<StoredSample> decoded;
  FUZZ_CHECK(DecodeSamples(payload, &pool, &decoded, type).ok());
  FUZZ_CHECK(pool == "pool" && decoded.size() == 1 && decoded[0] == *stored);
  FUZZ_CHECK(static_cast<int64_t>(payload.size()) == 8 + 4 + 4 + EncodedSampleBytes(*stored));
  // The store takes it, once.
  SampleStore store(int64_t{1} << 30);
  FUZZ_CHECK(store.RegisterModel("pool", model).ok());
  if (is_piece) {
    // A piece 0 opens the sample (twice in one request is refused); a later
    // piece finds nothing to extend.
    absl::StatusOr<PutResult> twice = store.Put("pool", {*stored, *stored});
    FUZZ_CHECK(twice.status().code() == (sample.piece() > 0 ? absl::StatusCode::kNotFound
                                                            : absl::StatusCode::kInvalidArgument));
    absl::StatusOr<PutResult> once = store.Put("pool", {*stored});
    FUZZ_CHECK(sample.piece() > 0 ? absl::IsNotFound(once.status()) : once.ok());
    FUZZ_CHECK(store.GetPool("pool")->num_open_samples == (sample.piece() > 0 ? 0 : 1));
    return 0;
  }
  absl::StatusOr<PutResult> put = store.Put("pool", {*stored, *stored});
  FUZZ_CHECK(put.ok() && put->duplicates == 1);
  FUZZ_CHECK(store.GetPool("pool")->num_samples == 1);
  return 0;
}
