#include "cli/bench/layout_command.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/flags.h"
#include "client/cpp/client.h"
#include "testing/synthetic_rollouts.h"
#include "client/cpp/trainer_stream.h"
#include "server/server.h"

namespace rollpack {
namespace {

struct Case {
  std::string name;
  int dp, cp, tp, pp;
  int64_t max_tokens_per_rank;
};

struct RankBytes {
  int64_t sent = 0;     // serialized Microbatch messages
  int64_t minimal = 0;  // the rank's own rows and layers, nothing else
};

// What a rank needs of one micro-batch, counted from the message's own
// shapes: tokens on the first stage, fields on the last, its router rows of
// its stage's MoE layers, the mask, cu_seqlens.
int64_t MinimalBytes(const v1::Microbatch& mb) {
  auto bytes = [](const v1::NDArray& a) { return static_cast<int64_t>(a.data().size()); };
  int64_t total = bytes(mb.cu_seqlens()) + bytes(mb.cu_seqlens_padded()) + bytes(mb.tokens()) +
                  bytes(mb.replay_experts()) + bytes(mb.replay_mask());
  for (const auto& [name, field] : mb.token_fields()) total += bytes(field);
  return total;
}

int64_t SampleBytesCompact(const v1::Sample& s, const v1::ModelSpec& model) {
  const int64_t n = s.tokens().shape(0);
  int64_t bytes = 4 * n;
  for (const auto& [name, field] : s.token_fields()) bytes += field.data().size();
  // Stored layers: M, then the MTP layers with mtp_routing (layout.md section 10).
  const int64_t moe = (model.moe_layers_size() > 0 ? model.moe_layers_size() : model.num_layers()) +
                      (model.mtp_routing() ? model.num_mtp_layers() : 0);
  bytes += n * moe * model.topk() * (model.num_experts() <= 256 ? 1 : 2);
  return bytes;
}

int RunCase(RollpackClient& client, const Case& c, const v1::ModelSpec& model,
            const std::vector<v1::Sample>& samples, std::string* json) {
  const std::string pool = absl::StrCat("bench-", c.name);
  if (!client.RegisterModel(pool, model).ok() || !client.PutSamples(pool, samples).ok()) {
    std::fprintf(stderr, "bench layout: ingest failed\n");
    return 1;
  }
  v1::CreateStepRequest create;
  create.set_step_id(pool);
  create.set_pool(pool);
  create.set_num_samples(static_cast<int>(samples.size()));
  v1::Topology* t = create.mutable_topology();
  t->set_dp(c.dp);
  t->set_cp(c.cp);
  t->set_tp(c.tp);
  t->set_pp(c.pp);
  t->set_max_tokens_per_rank(c.max_tokens_per_rank);
  absl::StatusOr<v1::StepInfo> step = client.CreateStep(create);
  absl::StatusOr<v1::Plan> plan = client.GetPlan(create.step_id());
  if (!step.ok() || !plan.ok()) {
    std::fprintf(stderr, "bench layout: %s\n", step.status().ToString().c_str());
    return 1;
  }
  // Per DP replica, the samples of its partition (static CP: group d).
  std::map<std::string, const v1::Sample*> by_id;
  for (const v1::Sample& s : samples) by_id[s.sample_id()] = &s;
  std::vector<int64_t> partition_bytes(c.dp, 0);
  for (const v1::PlanMicrobatch& mb : plan->microbatches()) {
    for (const v1::RankGroup& g : mb.groups()) {
      for (const std::string& id : g.sample_ids()) {
        partition_bytes[g.first_rank() / c.cp] += SampleBytesCompact(*by_id[id], model);
      }
    }
  }
  int64_t sent = 0, minimal = 0, partition = 0, max_sent = 0, max_minimal = 0;
  double worst_ratio = 0;
  int ranks = 0;
  for (int d = 0; d < c.dp; ++d)
    for (int cp = 0; cp < c.cp; ++cp)
      for (int tp = 0; tp < c.tp; ++tp)
        for (int p = 0; p < c.pp; ++p) {
          v1::RankCoords rank;
          rank.set_dp(d);
          rank.set_cp(cp);
          rank.set_tp(tp);
          rank.set_pp(p);
          RankBytes r;
          TrainerStream stream(client.channel(), create.step_id(), rank);
          while (true) {
            absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
            if (!next.ok()) {
              std::fprintf(stderr, "bench layout: %s\n", next.status().ToString().c_str());
              return 1;
            }
            if (!next->has_value()) break;
            r.sent += static_cast<int64_t>((*next)->ByteSizeLong());
            r.minimal += MinimalBytes(**next);
          }
          sent += r.sent;
          minimal += r.minimal;
          partition += partition_bytes[d];
          max_sent = std::max(max_sent, r.sent);
          max_minimal = std::max(max_minimal, r.minimal);
          worst_ratio = std::max(worst_ratio, static_cast<double>(r.sent) / r.minimal);
          ++ranks;
        }
  if (!client.ReleaseStep(create.step_id()).ok()) return 1;
  const double ratio = static_cast<double>(sent) / minimal;
  const double partition_ratio = static_cast<double>(partition) / minimal;
  std::printf("%-26s %6d %5d %12.1f %12.1f %8.4f %8.4f %14.1f %9.2fx\n",
              absl::StrCat(c.name, " dp", c.dp, " cp", c.cp, " tp", c.tp, " pp", c.pp).c_str(),
              ranks, step->num_microbatches(), minimal / 1e6 / ranks, sent / 1e6 / ranks, ratio,
              worst_ratio, partition / 1e6 / ranks, partition_ratio);
  absl::StrAppend(json, json->empty() ? "" : ",\n  ",
                  absl::StrCat("{\"case\": \"", c.name, "\", \"dp\": ", c.dp, ", \"cp\": ", c.cp,
                               ", \"tp\": ", c.tp, ", \"pp\": ", c.pp, ", \"ranks\": ", ranks,
                               ", \"microbatches\": ", step->num_microbatches(),
                               ", \"minimal_bytes\": ", minimal, ", \"sent_bytes\": ", sent,
                               ", \"sent_over_minimal\": ", ratio,
                               ", \"worst_rank_sent_over_minimal\": ", worst_ratio,
                               ", \"dp_partition_bytes\": ", partition,
                               ", \"dp_partition_over_minimal\": ", partition_ratio, "}"));
  return 0;
}

}  // namespace

int RunBenchLayoutCommand(int argc, char** argv) {
  int num_samples = 512;
  FlagSet flags("rollpack bench layout",
                "Bytes each trainer rank receives from an embedded rollpackd, for three "
                "topologies, versus the minimal bytes it needs (its own rows and layers) and "
                "versus fetching its whole DP partition and slicing locally.");
  flags.Int("samples", &num_samples, "Synthetic rollouts per topology.").Min(1);
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start({});
  if (!server.ok()) return 1;
  RollpackClient client(MakeChannel((*server)->address()));
  v1::ModelSpec model;
  model.set_name("Qwen3-30B-A3B");
  model.set_num_layers(48);
  model.set_num_experts(128);
  model.set_topk(8);
  SyntheticOptions synth;
  synth.num_samples = num_samples;
  synth.max_length = 16384;
  const std::vector<v1::Sample> samples = MakeSyntheticRollouts(model, synth);

  const std::vector<Case> cases = {
      {"demo", 4, 2, 2, 2, 8192},
      {"wide-tp", 2, 2, 4, 4, 8192},
      {"deep-pp", 2, 1, 2, 8, 16384},
  };
  std::printf("rollpack bench layout: %d synthetic %s rollouts (48 MoE layers, top-8, E=128)\n\n",
              num_samples, model.name().c_str());
  std::printf("%-26s %6s %5s %12s %12s %8s %8s %14s %10s\n", "topology", "ranks", "mbs",
              "need MB/rank", "sent MB/rank", "ratio", "worst", "DP-part MB/rk", "DP/need");
  std::string json;
  for (const Case& c : cases) {
    if (RunCase(client, c, model, samples, &json) != 0) return 1;
  }
  std::printf("\nratio = bytes rollpack sends / bytes the rank needs (its own rows and layers;\n"
              "the excess is protobuf framing). DP-part = bytes if every rank fetched its whole\n"
              "DP partition (tokens, fields, all MoE layers at uint8) and sliced locally.\n");
  std::printf("\nJSON:\n[\n  %s\n]\n", json.c_str());
  (*server)->Shutdown();
  return 0;
}

}  // namespace rollpack
