#include "cli/bench/pieces_command.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "cli/bench/support.h"
#include "cli/flags.h"
#include "server/ingest/sample_validation.h"
#include "server/store/convert.h"
#include "server/store/durable_log.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace {

struct PiecesBenchConfig {
  int pieces = 64;
  int piece_tokens = 512;
  int rollouts = 8;
  int layers = 48;
  int experts = 128;
  int topk = 8;
  std::string fsync = "never";
};

// One rollout's token t, and its routed ids: distinct within a row.
int32_t Token(int64_t t) { return static_cast<int32_t>(t % 32000); }
uint8_t Expert(int64_t t, int layer, int j, int experts, int topk) {
  return static_cast<uint8_t>((t * 7 + layer * 3) % (experts / topk) + j * (experts / topk));
}

// Tokens [begin, end) with routed rows [rows_begin, rows_end), as a producer
// sends them: uint8 ids in the full layout, a float32 logprobs field.
v1::Sample Message(const std::string& id, const PiecesBenchConfig& c, int piece, bool partial,
                   int64_t begin, int64_t end, int64_t rows_begin, int64_t rows_end) {
  v1::Sample s;
  s.set_sample_id(id);
  s.set_piece(piece);
  s.set_partial(partial);
  s.set_policy_version(1 + piece / 16);
  const int64_t t = end - begin;
  v1::NDArray* tokens = s.mutable_tokens();
  tokens->set_dtype(v1::INT32);
  tokens->add_shape(t);
  std::string* data = tokens->mutable_data();
  data->resize(static_cast<size_t>(t) * 4);
  for (int64_t i = 0; i < t; ++i) {
    const int32_t v = Token(begin + i);
    std::memcpy(data->data() + i * 4, &v, 4);
  }
  v1::NDArray& logprobs = (*s.mutable_token_fields())["logprobs"];
  logprobs.set_dtype(v1::FLOAT32);
  logprobs.add_shape(t);
  logprobs.mutable_data()->assign(static_cast<size_t>(t) * 4, '\0');
  const int64_t rows = rows_end - rows_begin;
  v1::NDArray* experts = s.mutable_routed_experts();
  experts->set_dtype(v1::UINT8);
  experts->add_shape(rows);
  experts->add_shape(c.layers);
  experts->add_shape(c.topk);
  std::string* ids = experts->mutable_data();
  ids->resize(static_cast<size_t>(rows) * c.layers * c.topk);
  size_t at = 0;
  for (int64_t r = rows_begin; r < rows_end; ++r)
    for (int l = 0; l < c.layers; ++l)
      for (int j = 0; j < c.topk; ++j) (*ids)[at++] = static_cast<char>(Expert(r, l, j, c.experts, c.topk));
  s.set_routed_experts_row_offset(static_cast<int32_t>(rows_begin));
  return s;
}

struct DurableBenchStore {
  std::string dir;
  std::unique_ptr<DurableLog> log;
  std::unique_ptr<SampleStore> store;
  ~DurableBenchStore() {
    store.reset();
    log.reset();
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
};

absl::Status OpenStore(const PiecesBenchConfig& c, const ModelSpec& model,
                       DurableBenchStore* out) {
  char tmpl[] = "/tmp/rollpack-bench-pieces-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  out->dir = tmpl;
  DurableLogOptions options;
  options.dir = out->dir;
  ASSIGN_OR_RETURN(options.fsync, ParseFsyncPolicy(c.fsync));
  std::vector<LogRecord> records;
  RecoveryInfo info;
  ASSIGN_OR_RETURN(out->log, DurableLog::Open(options, &records, &info));
  out->store = std::make_unique<SampleStore>(int64_t{1} << 40);
  out->store->AttachLog(out->log.get());
  return out->store->RegisterModel("pool", model).status();
}

// Validation and commit of one message, as ingest does them; milliseconds.
absl::StatusOr<double> Store(SampleStore& store, const ModelSpec& model, v1::Sample message) {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(StoredSample stored, ValidateAndTakeSample(&message, model));
  std::vector<StoredSample> batch;
  batch.push_back(std::move(stored));
  RETURN_IF_ERROR(store.Put("pool", std::move(batch)).status());
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += v[i];
  return end > begin ? sum / static_cast<double>(end - begin) : 0;
}

}  // namespace

int RunBenchPiecesCommand(int argc, char** argv) {
  PiecesBenchConfig c;
  FlagSet flags("rollpack bench pieces",
                "Extending a sample, piece by piece (validation, store, durable log): the last "
                "pieces against the first, and against the same rollout sent whole, side by side "
                "in one run, in this process.");
  flags.Int("pieces", &c.pieces, "Pieces per rollout (P).").Min(2);
  flags.Int("piece-tokens", &c.piece_tokens, "Tokens per piece (T).").Min(2);
  flags.Int("rollouts", &c.rollouts, "Rollouts written each way.").Min(1);
  flags.Int("layers", &c.layers, "Layers of the model, all MoE.").Min(1);
  flags.Int("experts", &c.experts, "Experts per layer (<= 256: uint8 ids).").Min(2).Max(256);
  flags.Int("topk", &c.topk, "Experts per token.").Min(1);
  flags.String("fsync", &c.fsync, "The logs' --fsync policy: always, batch or never.");
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  if (c.experts % c.topk != 0) {
    std::fprintf(stderr, "rollpack bench pieces: --experts must be a multiple of --topk\n");
    return 2;
  }
  ModelSpec model;
  model.name = "bench-pieces";
  model.num_layers = c.layers;
  model.num_experts = c.experts;
  model.topk = c.topk;

  DurableBenchStore pieces, whole, unit;
  for (DurableBenchStore* s : {&pieces, &whole, &unit}) {
    if (absl::Status st = OpenStore(c, model, s); !st.ok()) {
      std::fprintf(stderr, "rollpack bench pieces: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  const int64_t t = c.piece_tokens;
  const int64_t n = t * c.pieces;
  Topology topology;
  topology.max_tokens_per_rank = n;
  // per_piece[k]: piece k's time, summed over rollouts.
  std::vector<double> per_piece(c.pieces, 0);
  std::vector<int64_t> log_bytes(c.pieces, 0);
  std::vector<double> whole_ms, unit_ms;
  bool ok = true;
  auto fail = [&](const std::string& what, const absl::Status& s) {
    std::fprintf(stderr, "rollpack bench pieces: %s: %s\n", what.c_str(), s.ToString().c_str());
    ok = false;
  };
  for (int r = 0; r < c.rollouts && ok; ++r) {
    const std::string id = absl::StrCat("r", r);
    // An engine's pattern: each piece routes all its tokens but the last,
    // whose row comes with the next piece; the sealed sample ends at n - 1.
    std::vector<v1::Sample> messages;
    for (int k = 0; k < c.pieces; ++k) {
      const int64_t rows_begin = k == 0 ? 0 : k * t - 1;
      messages.push_back(Message(id, c, k, k + 1 < c.pieces, k * t, (k + 1) * t, rows_begin,
                                 (k + 1) * t - 1));
    }
    // Interleaved: a piece, then every so often a whole rollout and a
    // one-piece sample, so that drift hits all three alike.
    for (int k = 0; k < c.pieces && ok; ++k) {
      const int64_t before = pieces.log->written();
      absl::StatusOr<double> ms = Store(*pieces.store, model, std::move(messages[k]));
      if (!ms.ok()) {
        fail(absl::StrCat(id, " piece ", k), ms.status());
        break;
      }
      per_piece[k] += *ms;
      log_bytes[k] += pieces.log->written() - before;
      if (k % 8 == 7) {
        absl::StatusOr<double> u = Store(*unit.store, model,
                                         Message(absl::StrCat(id, "-", k), c, 0, false, 0, t, 0, t - 1));
        if (!u.ok()) fail("one-piece sample", u.status());
        else unit_ms.push_back(*u);
      }
    }
    absl::StatusOr<double> w = Store(*whole.store, model, Message(id, c, 0, false, 0, n, 0, n - 1));
    if (!w.ok()) {
      fail("whole rollout", w.status());
      break;
    }
    whole_ms.push_back(*w);
    // The sealed sample is the whole one (policy version: its oldest piece's).
    absl::StatusOr<std::shared_ptr<const Step>> a =
        pieces.store->CreateStep(absl::StrCat("a", r), "pool", {id}, 0, topology);
    absl::StatusOr<std::shared_ptr<const Step>> b =
        whole.store->CreateStep(absl::StrCat("b", r), "pool", {id}, 0, topology);
    if (!a.ok() || !b.ok()) {
      fail("CreateStep", a.ok() ? b.status() : a.status());
      break;
    }
    const StoredSample& x = *(*a)->samples[0];
    const StoredSample& y = *(*b)->samples[0];
    if (x.tokens != y.tokens || x.experts != y.experts || x.row_valid != y.row_valid ||
        x.token_fields != y.token_fields) {
      std::fprintf(stderr, "rollpack bench pieces: %s sealed differs from it sent whole\n",
                   id.c_str());
      ok = false;
    }
    for (SampleStore* s : {pieces.store.get(), whole.store.get()}) {
      if (!s->ReleaseStep(absl::StrCat(s == pieces.store.get() ? "a" : "b", r)).ok()) ok = false;
    }
  }
  if (!ok) return 1;

  for (double& ms : per_piece) ms /= c.rollouts;
  const size_t eighth = std::max<size_t>(1, per_piece.size() / 8);
  const double first = Mean(per_piece, 1, 1 + eighth);  // piece 0 opens: not an extension
  const double last = Mean(per_piece, per_piece.size() - eighth, per_piece.size());
  double sum = 0;
  for (double ms : per_piece) sum += ms;
  const double whole_median = Median(whole_ms);
  const double unit_median = Median(unit_ms);
  const double piece_payload = static_cast<double>(t) * (4 + 4 + c.layers * c.topk);
  double mean_log = 0;
  for (int64_t b : log_bytes) mean_log += static_cast<double>(b) / c.rollouts;
  mean_log /= c.pieces;

  std::printf("rollpack bench pieces: %d rollouts of %d pieces x %d tokens (%lld tokens), "
              "%d layers top-%d of %d experts, --fsync %s\n\n",
              c.rollouts, c.pieces, c.piece_tokens, static_cast<long long>(n), c.layers, c.topk,
              c.experts, c.fsync.c_str());
  std::printf("%-44s %12s %10s\n", "", "ms", "ratio");
  std::printf("%-44s %12.3f %10s\n", "one-piece sample sent whole (the unit)", unit_median, "1.00");
  std::printf("%-44s %12.3f %10.2f\n", "pieces 1-8: extension, first eighth", first,
              first / unit_median);
  std::printf("%-44s %12.3f %10.2f\n", "last eighth of the pieces", last, last / unit_median);
  std::printf("%-44s %12.3f %10.2f\n", "last eighth / first eighth", last / first, last / first);
  std::printf("%-44s %12.3f %10s\n", "whole rollout sent as one sample", whole_median, "");
  std::printf("%-44s %12.3f %10.2f\n", "all pieces of a rollout / it sent whole", sum,
              sum / whole_median);
  std::printf("%-44s %12.0f %10.2f\n", "log bytes per piece / piece payload bytes", mean_log,
              mean_log / piece_payload);
  std::printf("\nJSON:\n%s\n",
              absl::StrFormat(
                  "{\"pieces\": %d, \"piece_tokens\": %d, \"rollouts\": %d, \"fsync\": \"%s\", "
                  "\"unit_ms\": %.4f, \"first_eighth_ms\": %.4f, \"last_eighth_ms\": %.4f, "
                  "\"last_over_first\": %.3f, \"whole_ms\": %.4f, \"pieces_sum_ms\": %.4f, "
                  "\"pieces_over_whole\": %.3f, \"log_bytes_per_piece\": %.0f, "
                  "\"log_over_payload\": %.3f, \"ok\": true}",
                  c.pieces, c.piece_tokens, c.rollouts, c.fsync, unit_median, first, last,
                  last / first, whole_median, sum, sum / whole_median, mean_log,
                  mean_log / piece_payload)
                  .c_str());
  return 0;
}

}  // namespace rollpack
