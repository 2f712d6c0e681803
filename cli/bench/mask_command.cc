#include "cli/bench/mask_command.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "cli/bench/support.h"
#include "cli/flags.h"
#include "server/delivery/microbatch_encoder.h"
#include "server/ingest/sample_validation.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace {

struct MaskBenchConfig {
  int samples = 32;
  int prompt_tokens = 1024;
  int response_tokens = 3072;
  int layers = 48;
  int experts = 128;
  int topk = 8;
  int vocab = 151936;
  // Mean ids the sampler keeps per generated token (top-k/top-p/min-p).
  int kept = 32;
  int rounds = 5;
  int dp = 4;
  int cp = 2;
  int pp = 2;
};

void PutInt32s(const std::vector<int32_t>& values, v1::NDArray* array) {
  array->set_dtype(v1::INT32);
  array->clear_shape();
  array->add_shape(static_cast<int64_t>(values.size()));
  array->mutable_data()->assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
}

// A deterministic kept-set size around the mean: a sampler keeps few ids
// where the model is sure and many where it is not.
int KeptAt(int64_t t, int mean) {
  const int64_t spread = (t * 2654435761u) % 7;  // 0..6, mean 3
  return static_cast<int>(std::max<int64_t>(1, mean * (spread + 1) / 4));
}

// One rollout as a producer sends it: uint8 routing in the full layout, a
// float32 logprobs field and, with `mask`, the sampling mask of each
// generated token (prompt tokens: empty lists) as CSR int32.
v1::Sample Rollout(const MaskBenchConfig& c, int index, bool mask) {
  const int64_t n = c.prompt_tokens + c.response_tokens;
  v1::Sample s;
  s.set_sample_id(absl::StrCat("r", index));
  std::vector<int32_t> tokens(n);
  for (int64_t t = 0; t < n; ++t) tokens[t] = static_cast<int32_t>((t * 31 + index) % c.vocab);
  PutInt32s(tokens, s.mutable_tokens());
  v1::NDArray& logprobs = (*s.mutable_token_fields())["logprobs"];
  logprobs.set_dtype(v1::FLOAT32);
  logprobs.add_shape(n);
  logprobs.mutable_data()->assign(static_cast<size_t>(n) * 4, '\0');
  v1::NDArray* experts = s.mutable_routed_experts();
  experts->set_dtype(v1::UINT8);
  experts->add_shape(n - 1);
  experts->add_shape(c.layers);
  experts->add_shape(c.topk);
  std::string* ids = experts->mutable_data();
  ids->resize(static_cast<size_t>(n - 1) * c.layers * c.topk);
  const int stride = c.experts / c.topk;
  size_t at = 0;
  for (int64_t r = 0; r + 1 < n; ++r)
    for (int l = 0; l < c.layers; ++l)
      for (int j = 0; j < c.topk; ++j) {
        (*ids)[at++] = static_cast<char>((r * 7 + l * 3) % stride + j * stride);
      }
  if (mask) {
    std::vector<int32_t> values, offsets = {0};
    for (int64_t t = 0; t < n; ++t) {
      if (t >= c.prompt_tokens) {
        const int kept = KeptAt(t, c.kept);
        for (int k = 0; k < kept; ++k) {
          values.push_back(static_cast<int32_t>((tokens[t] + int64_t{k} * 977) % c.vocab));
        }
      }
      offsets.push_back(static_cast<int32_t>(values.size()));
    }
    v1::RaggedArray& field = (*s.mutable_ragged_token_fields())["sampling_mask"];
    PutInt32s(values, field.mutable_values());
    PutInt32s(offsets, field.mutable_offsets());
  }
  return s;
}

struct Timed {
  double ingest_s = 0;
  double fetch_s = 0;
  int64_t wire_bytes = 0;     // PutSamples payload (serialized samples)
  int64_t fetched_bytes = 0;  // every rank's micro-batches as encoded
};

// Ingests `rollouts` into a fresh store (validation and commit, as ingest
// does them), then creates a step over all of them and encodes every rank's
// every micro-batch.
absl::StatusOr<Timed> IngestAndFetch(const MaskBenchConfig& c, const ModelSpec& model,
                                     const std::vector<v1::Sample>& rollouts, int round) {
  Timed timed;
  SampleStore store(int64_t{1} << 40);
  RETURN_IF_ERROR(store.RegisterModel("pool", model).status());
  std::vector<v1::Sample> copies = rollouts;  // validation takes their bytes
  for (const v1::Sample& s : copies) timed.wire_bytes += static_cast<int64_t>(s.ByteSizeLong());
  const absl::Time ingest_start = absl::Now();
  std::vector<StoredSample> stored;
  stored.reserve(copies.size());
  for (v1::Sample& s : copies) {
    ASSIGN_OR_RETURN(StoredSample one, ValidateAndTakeSample(&s, model));
    stored.push_back(std::move(one));
  }
  RETURN_IF_ERROR(store.Put("pool", std::move(stored)).status());
  timed.ingest_s = absl::ToDoubleSeconds(absl::Now() - ingest_start);

  Topology topology;
  topology.dp = c.dp;
  topology.cp = c.cp;
  topology.pp = c.pp;
  topology.max_tokens_per_rank = c.prompt_tokens + c.response_tokens;
  std::vector<std::string> ids;
  for (const v1::Sample& s : rollouts) ids.push_back(s.sample_id());
  ASSIGN_OR_RETURN(std::shared_ptr<const Step> step,
                   store.CreateStep(absl::StrCat("s", round + 1), "pool", ids, 0, topology));
  const absl::Time fetch_start = absl::Now();
  MicrobatchEncoder encoder;
  std::string buffer;
  for (int d = 0; d < c.dp; ++d)
    for (int r = 0; r < c.cp; ++r)
      for (int p = 0; p < c.pp; ++p) {
        MicrobatchRequest request;
        request.rank = RankCoords{d, r, 0, p};
        for (request.index = 0;; ++request.index) {
          absl::Status prepared = encoder.Prepare(*step, request);
          if (absl::IsOutOfRange(prepared)) break;
          RETURN_IF_ERROR(prepared);
          buffer.resize(encoder.encoded_size());
          RETURN_IF_ERROR(encoder.Encode(absl::MakeSpan(buffer)));
          timed.fetched_bytes += static_cast<int64_t>(buffer.size());
        }
      }
  timed.fetch_s = absl::ToDoubleSeconds(absl::Now() - fetch_start);
  return timed;
}

}  // namespace

int RunBenchMaskCommand(int argc, char** argv) {
  MaskBenchConfig c;
  FlagSet flags("rollpack bench mask",
                "What a sampling mask (ragged token field) costs: bytes per token as CSR against "
                "a vocabulary bitset, and ingest and fetch throughput with the mask against "
                "without it, side by side in one run, in this process.");
  flags.Int("samples", &c.samples, "Rollouts per round.").Min(1);
  flags.Int("prompt-tokens", &c.prompt_tokens, "Prompt tokens per rollout (no mask).").Min(1);
  flags.Int("response-tokens", &c.response_tokens, "Generated tokens per rollout.").Min(1);
  flags.Int("layers", &c.layers, "Layers of the model, all MoE.").Min(1);
  flags.Int("experts", &c.experts, "Experts per layer (<= 256: uint8 ids).").Min(2).Max(256);
  flags.Int("topk", &c.topk, "Experts per token.").Min(1);
  flags.Int("vocab", &c.vocab, "The model's vocab_size (uint16 ids when <= 65536).").Min(2);
  flags.Int("kept", &c.kept, "Mean ids kept per generated token.").Min(1);
  flags.Int("rounds", &c.rounds, "Rounds of each, alternating.").Min(1);
  flags.Int("dp", &c.dp, "DP ranks of the fetch.").Min(1);
  flags.Int("cp", &c.cp, "CP ranks of the fetch.").Min(1);
  flags.Int("pp", &c.pp, "Pipeline stages of the fetch.").Min(1);
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  if (c.experts % c.topk != 0) {
    std::fprintf(stderr, "rollpack bench mask: --experts must be a multiple of --topk\n");
    return 2;
  }
  ModelSpec model;
  model.name = "bench-mask";
  model.num_layers = c.layers;
  model.num_experts = c.experts;
  model.topk = c.topk;
  model.vocab_size = c.vocab;

  // Bytes per generated token of the mask: measured on this run's rollouts
  // (serialized Sample, stored sample, one micro-batch row) and, for other
  // vocabularies, as CSR (ids plus an offset per token) against a bitset.
  std::vector<v1::Sample> plain, masked;
  for (int i = 0; i < c.samples; ++i) {
    plain.push_back(Rollout(c, i, false));
    masked.push_back(Rollout(c, i, true));
  }
  int64_t kept_ids = 0;
  for (const v1::Sample& s : masked) {
    kept_ids += s.ragged_token_fields().at("sampling_mask").values().shape(0);
  }
  const double generated = static_cast<double>(c.samples) * c.response_tokens;
  const double mean_kept = static_cast<double>(kept_ids) / generated;

  std::vector<Timed> without, with;
  // Round -1 warms the allocator and the caches up and is not counted.
  for (int round = -1; round < c.rounds; ++round) {
    for (bool mask : {false, true}) {
      absl::StatusOr<Timed> t = IngestAndFetch(c, model, mask ? masked : plain, round);
      if (!t.ok()) {
        std::fprintf(stderr, "rollpack bench mask: %s: %s\n", mask ? "with mask" : "without",
                     t.status().ToString().c_str());
        return 1;
      }
      if (round >= 0) (mask ? with : without).push_back(*t);
    }
  }
  auto median = [](const std::vector<Timed>& v, double Timed::*field) {
    std::vector<double> x;
    for (const Timed& t : v) x.push_back(t.*field);
    return Median(x);
  };
  const double in_without = median(without, &Timed::ingest_s);
  const double in_with = median(with, &Timed::ingest_s);
  const double out_without = median(without, &Timed::fetch_s);
  const double out_with = median(with, &Timed::fetch_s);
  const double wire_without = static_cast<double>(without[0].wire_bytes);
  const double wire_with = static_cast<double>(with[0].wire_bytes);
  const double fetched_without = static_cast<double>(without[0].fetched_bytes);
  const double fetched_with = static_cast<double>(with[0].fetched_bytes);
  const int stored_id = model.ragged_id_bytes();
  const double wire_per_token = (wire_with - wire_without) / generated;
  const double stored_per_token = mean_kept * stored_id + 8.0;  // ids + an int64 offset

  std::printf("rollpack bench mask: %d rollouts of %d prompt + %d generated tokens, %d layers "
              "top-%d of %d experts, vocab %d, %.1f ids kept per generated token, dp=%d cp=%d "
              "pp=%d, %d rounds\n\n",
              c.samples, c.prompt_tokens, c.response_tokens, c.layers, c.topk, c.experts, c.vocab,
              mean_kept, c.dp, c.cp, c.pp, c.rounds);
  std::printf("Bytes per generated token of the mask as sent (its ids and an int32 offset)\n");
  std::printf("%-12s %8s %14s %14s %14s %10s\n", "vocab", "kept", "CSR int32", "CSR uint16",
              "bitset", "stored as");
  std::vector<std::string> rows_json;
  std::vector<int> vocabs = {32000, 65536, 128256, 151936};
  if (std::find(vocabs.begin(), vocabs.end(), c.vocab) == vocabs.end()) vocabs.push_back(c.vocab);
  for (int vocab : vocabs) {
    for (double kept : {1.0, 20.0, mean_kept, 256.0}) {
      const double csr32 = 4 * kept + 4;
      const double csr16 = vocab <= 65536 ? 2 * kept + 4 : -1;
      const double bitset = vocab / 8.0;
      std::printf("%-12d %8.1f %14.1f %14s %14.0f %10s\n", vocab, kept, csr32,
                  csr16 < 0 ? "-" : absl::StrFormat("%.1f", csr16).c_str(), bitset,
                  vocab <= 65536 ? "uint16" : "int32");
      rows_json.push_back(absl::StrFormat(
          "{\"vocab\": %d, \"kept\": %.1f, \"csr_int32\": %.1f, \"csr_uint16\": %.1f, "
          "\"bitset\": %.0f}",
          vocab, kept, csr32, csr16, bitset));
    }
  }
  std::printf("\nMeasured on this run's rollouts (vocab %d, %.1f kept): on the wire %.1f bytes "
              "per generated token (int32 ids and offsets as sent), stored %.1f (%s ids + int64 "
              "offset)\n\n",
              c.vocab, mean_kept, wire_per_token, stored_per_token,
              stored_id == 2 ? "uint16" : "int32");
  std::printf("%-34s %12s %12s %10s\n", "", "without", "with mask", "ratio");
  std::printf("%-34s %12.0f %12.0f %10.2f\n", "PutSamples payload (MB)", wire_without / 1e6,
              wire_with / 1e6, wire_with / wire_without);
  std::printf("%-34s %12.3f %12.3f %10.2f\n", "ingest: validation + store (s)", in_without,
              in_with, in_with / in_without);
  std::printf("%-34s %12.2f %12.2f %10.2f\n", "ingest GB/s of payload", wire_without / in_without / 1e9,
              wire_with / in_with / 1e9, (wire_with / in_with) / (wire_without / in_without));
  std::printf("%-34s %12.0f %12.0f %10.2f\n", "fetched, every rank (MB)", fetched_without / 1e6,
              fetched_with / 1e6, fetched_with / fetched_without);
  std::printf("%-34s %12.3f %12.3f %10.2f\n", "fetch: encode every rank (s)", out_without,
              out_with, out_with / out_without);
  std::printf("%-34s %12.2f %12.2f %10.2f\n", "fetch GB/s encoded", fetched_without / out_without / 1e9,
              fetched_with / out_with / 1e9,
              (fetched_with / out_with) / (fetched_without / out_without));
  std::printf(
      "\nJSON:\n%s\n",
      absl::StrFormat(
          "{\"samples\": %d, \"prompt_tokens\": %d, \"response_tokens\": %d, \"vocab\": %d, "
          "\"mean_kept\": %.2f, \"wire_bytes_per_token\": %.2f, \"stored_bytes_per_token\": %.2f, "
          "\"ingest_s\": [%.4f, %.4f], \"ingest_gbps\": [%.3f, %.3f], \"fetch_s\": [%.4f, %.4f], "
          "\"fetch_gbps\": [%.3f, %.3f], \"payload_mb\": [%.1f, %.1f], \"fetched_mb\": [%.1f, "
          "%.1f], \"bytes_per_token\": [%s], \"ok\": true}",
          c.samples, c.prompt_tokens, c.response_tokens, c.vocab, mean_kept, wire_per_token,
          stored_per_token, in_without, in_with, wire_without / in_without / 1e9,
          wire_with / in_with / 1e9, out_without, out_with, fetched_without / out_without / 1e9,
          fetched_with / out_with / 1e9, wire_without / 1e6, wire_with / 1e6,
          fetched_without / 1e6, fetched_with / 1e6, absl::StrJoin(rows_json, ", "))
          .c_str());
  return 0;
}

}  // namespace rollpack
