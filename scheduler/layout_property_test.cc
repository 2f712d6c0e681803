// Seeded property test: random valid topologies, models and plans; gathers
// every rank's tokens, a token field and replay, and checks them against an
// independent per-token reference of layout.md and by reassembly (every real
// token exactly once per CP group, every router row of every MoE layer
// exactly once per group / SP split / owning stage), with MTP layers
// (layout.md section 10) on the last stage for a share of the models, and a
// ragged field (section 13: one list per row, padding rows empty, offsets
// rebased) over the same rows as the tokens.
#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/layout.h"
#include "scheduler/layout_gather.h"
#include "scheduler/pipeline_layers.h"
#include "scheduler/ragged_gather.h"

namespace rollpack {
namespace {

using Rng = std::mt19937_64;

int Uniform(Rng& rng, int lo, int hi) {  // inclusive
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}
template <typename T>
T Pick(Rng& rng, std::vector<T> v) {
  return v[Uniform(rng, 0, static_cast<int>(v.size()) - 1)];
}

int64_t Lcm(int64_t a, int64_t b) { return a / std::gcd(a, b) * b; }

// Section 2, written out independently of topology.cc.
int64_t RefPadded(const Topology& t, int64_t n, int c) {
  const int64_t s = t.sequence_parallel ? t.tp : 1;
  const int64_t a = Lcm(c > 1 ? 2 * c * s : s, t.pad_multiple);
  return (n + a - 1) / a * a;
}

// Section 6 by laying the chunks out one after the other: virtual stage v
// = 0..vpp-1, then pipeline rank p = 0..pp-1, each chunk c_p layers.
std::vector<std::vector<int>> RefLayers(const std::vector<int>& chunk, int vpp) {
  std::vector<std::vector<int>> owned(chunk.size());
  int next = 0;
  for (int v = 0; v < vpp; ++v) {
    for (size_t p = 0; p < chunk.size(); ++p) {
      for (int i = 0; i < chunk[p]; ++i) owned[p].push_back(next++);
    }
  }
  return owned;
}

// One row of a rank's reference local stream.
struct RefRow {
  int seq;       // step sequence index
  int64_t pos;   // position in the padded sequence
  bool real;
  int64_t q;     // position in the micro-batch's padded stream
};

// Section 4, token by token.
std::vector<RefRow> RefStream(const PlanGroup& g, const std::vector<int64_t>& lengths,
                              int r) {
  std::vector<RefRow> rows;
  const int64_t c = g.cp_size;
  int64_t base = 0;
  for (size_t j = 0; j < g.sequences.size(); ++j) {
    const int seq = g.sequences[j];
    const int64_t p = g.padded_lengths[j];
    auto add = [&](int64_t lo, int64_t hi) {
      for (int64_t x = lo; x < hi; ++x) {
        rows.push_back({seq, x, x < lengths[seq], base + x});
      }
    };
    if (c == 1) {
      add(0, p);
    } else {
      const int64_t h = p / (2 * c);
      add(r * h, (r + 1) * h);
      add((2 * c - 1 - r) * h, (2 * c - r) * h);
    }
    base += p;
  }
  return rows;
}

// Token value of (sequence, position): unique and non-zero.
int32_t TokenOf(int seq, int64_t pos) { return (seq << 16) + static_cast<int32_t>(pos) + 1; }
// A 3-byte token field.
constexpr int kFieldBytes = 3;
uint8_t FieldByte(int seq, int64_t pos, int b) {
  return static_cast<uint8_t>(1 + (seq * 31 + pos * 7 + b * 101) % 251);
}

// Ragged field (section 13): token (seq, pos)'s list has RaggedCount
// values, RaggedValue(seq, pos, 0..count-1); about a third are empty.
int RaggedCount(uint64_t seed, int seq, int64_t pos) {
  const uint64_t h = (seed * 0x9e3779b97f4a7c15ULL) ^ (uint64_t(seq) << 32) ^ uint64_t(pos);
  const int c = static_cast<int>((h * 0xbf58476d1ce4e5b9ULL) >> 61);  // 0..7
  return c < 3 ? 0 : c - 2;
}
uint32_t RaggedValue(int seq, int64_t pos, int j) {
  return static_cast<uint32_t>((seq * 7919 + pos * 131 + j * 17 + 1) % 65521);
}

struct Case {
  Topology t;
  ModelSpec model;
  std::vector<int> chunk;  // layers per chunk of each stage
  Plan plan;
  std::vector<int64_t> lengths;
  std::string describe;
};

// Random aligned power-of-two partition of [0, R) with sizes in
// [min_cp, max_c].
void Partition(Rng& rng, int start, int size, int min_cp, int max_c,
               std::vector<std::pair<int, int>>* out) {
  const bool can_split = size / 2 >= min_cp && size > 1;
  if (size <= max_c && (!can_split || Uniform(rng, 0, 2) != 0)) {
    out->push_back({start, size});
    return;
  }
  Partition(rng, start, size / 2, min_cp, max_c, out);
  Partition(rng, start + size / 2, size / 2, min_cp, max_c, out);
}

Case RandomCase(uint64_t seed) {
  Rng rng(seed);
  Case k;
  Topology& t = k.t;
  t.dp = Uniform(rng, 1, 4);
  t.cp = Pick<int>(rng, {1, 1, 2, 3, 4});
  t.tp = Pick<int>(rng, {1, 2, 4});
  t.pp = Uniform(rng, 1, 4);
  t.vpp = t.pp > 1 && Uniform(rng, 0, 2) == 0 ? Uniform(rng, 2, 3) : 1;
  t.sequence_parallel = Uniform(rng, 0, 3) != 0;
  t.pad_multiple = Pick<int>(rng, {1, 1, 1, 3, 8, 16});
  t.scheduler = Uniform(rng, 0, 1) ? SchedulerKind::kDynamicCp : SchedulerKind::kStaticCp;
  const int ranks = t.dp * t.cp;
  if (t.scheduler == SchedulerKind::kDynamicCp) {
    std::vector<int> mins;
    for (int c = 1; c <= ranks; c *= 2) {
      if (ranks % c == 0) mins.push_back(c);
    }
    t.min_cp = Pick(rng, mins);
  }
  t.microbatch_group_size = t.vpp > 1 ? Uniform(rng, t.pp, t.pp + 1) : Uniform(rng, 1, 2);

  // Layers: chunk sizes per stage, optionally with F / Z.
  k.chunk.assign(t.pp, 0);
  bool first = false, last = false;
  if (t.pp > 1 && Uniform(rng, 0, 1)) {
    first = Uniform(rng, 0, 1);
    last = !first || Uniform(rng, 0, 1);
    if (t.vpp > 1 && first && last && t.pp == 2) first = false;
  }
  const int middle = Uniform(rng, 1, 3);
  for (int p = 0; p < t.pp; ++p) {
    if ((p == 0 && first) || (p == t.pp - 1 && last)) {
      k.chunk[p] = Uniform(rng, 1, 5);
    } else {
      k.chunk[p] = middle;
    }
  }
  if (first) t.num_layers_in_first_pipeline_stage = k.chunk[0] * t.vpp;
  if (last) t.num_layers_in_last_pipeline_stage = k.chunk[t.pp - 1] * t.vpp;
  const int n_layers = std::accumulate(k.chunk.begin(), k.chunk.end(), 0) * t.vpp;

  // Model: dense, all-MoE, or a random subset of MoE layers.
  ModelSpec& m = k.model;
  m.name = "prop";
  m.num_layers = n_layers;
  const int kind = Uniform(rng, 0, 9);
  if (kind == 0) {
    m.num_experts = 0;
    m.topk = 0;
  } else {
    m.num_experts = Pick<int>(rng, {2, 5, 8, 64, 256, 300, 1000});
    m.topk = Uniform(rng, 1, std::min(m.num_experts, 8));
    if (kind >= 4) {
      for (int l = 0; l < n_layers; ++l) {
        if (Uniform(rng, 0, 2) != 0) m.moe_layers.push_back(l);
      }
      if (m.moe_layers.empty()) m.moe_layers.push_back(n_layers - 1);
    }
  }
  // MTP layers (layout.md section 10) from a stream of their own, so the
  // cases above stay the ones every seed gave before MTP layers existed.
  Rng mtp_rng(seed * 7919 + 13);
  if (Uniform(mtp_rng, 0, 2) == 0) {
    m.num_mtp_layers = Uniform(mtp_rng, 1, 3);
    m.mtp_routing = !m.is_dense() && Uniform(mtp_rng, 0, 3) != 0;
  }

  // Token budget: at least what a 1-token sequence needs on any group.
  const int max_c = MaxCpGroupSize(t);
  int64_t need = 1;
  for (int c = 1; c <= max_c; c *= 2) {
    if (t.scheduler == SchedulerKind::kStaticCp && c != t.cp) continue;
    need = std::max(need, RefPadded(t, 1, c) / c);
  }
  if (t.scheduler == SchedulerKind::kStaticCp) need = RefPadded(t, 1, t.cp) / t.cp;
  t.max_tokens_per_rank = need * Uniform(rng, 1, 6) + Uniform(rng, 0, 40);

  // Plan: every micro-batch partitions the ranks into groups, and every
  // group gets 1..4 sequences whose lengths fit the remaining budget.
  const int num_mb = t.microbatch_group_size * Uniform(rng, 1, 2);
  k.plan.num_dpcp_ranks = ranks;
  std::vector<int64_t> plan_lengths;  // in creation order
  for (int mb = 0; mb < num_mb; ++mb) {
    std::vector<std::pair<int, int>> parts;
    if (t.scheduler == SchedulerKind::kStaticCp) {
      for (int d = 0; d < t.dp; ++d) parts.push_back({d * t.cp, t.cp});
    } else {
      int start = 0;
      while (start < ranks) {  // aligned power-of-two blocks
        int block = 1;
        while (start % (block * 2) == 0 && start + block * 2 <= ranks) block *= 2;
        Partition(rng, start, block, t.min_cp, max_c, &parts);
        start += block;
      }
    }
    PlanMicrobatch pm;
    for (auto [first_rank, c] : parts) {
      PlanGroup g;
      g.first_rank = first_rank;
      g.cp_size = c;
      const int want = Uniform(rng, 1, 4);
      int64_t used = 0;
      for (int s = 0; s < want; ++s) {
        // Largest n with padded(n)/c <= remaining budget.
        const int64_t rem = t.max_tokens_per_rank - used;
        const int64_t a = RefPadded(t, 1, c);
        const int64_t max_n = rem * c / a * a;
        if (max_n < 1) break;
        int64_t n;
        switch (Uniform(rng, 0, 3)) {
          case 0: n = max_n; break;
          case 1: n = std::max<int64_t>(1, max_n - Uniform(rng, 0, 2)); break;
          default: n = Uniform(rng, 1, static_cast<int>(std::min<int64_t>(max_n, 300)));
        }
        const int64_t p = RefPadded(t, n, c);
        used += p / c;
        g.sequences.push_back(static_cast<int>(plan_lengths.size()));
        g.padded_lengths.push_back(p);
        plan_lengths.push_back(n);
      }
      g.tokens_per_rank = used;
      g.work_per_rank = static_cast<double>(used);
      pm.groups.push_back(std::move(g));
    }
    k.plan.microbatches.push_back(std::move(pm));
  }
  // The step's sequence order is a random permutation of the plan's.
  std::vector<int> perm(plan_lengths.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  k.lengths.assign(plan_lengths.size(), 0);
  for (size_t i = 0; i < perm.size(); ++i) k.lengths[perm[i]] = plan_lengths[i];
  for (PlanMicrobatch& pm : k.plan.microbatches) {
    for (PlanGroup& g : pm.groups) {
      for (int& s : g.sequences) s = perm[s];
    }
  }
  k.describe = absl::StrCat(
      "seed ", seed, ": dp ", t.dp, " cp ", t.cp, " tp ", t.tp, " pp ", t.pp, " vpp ",
      t.vpp, " sp ", t.sequence_parallel, " pad ", t.pad_multiple, " ",
      TraitsOf(t.scheduler).alias, " min_cp ",
      t.min_cp, " F ", t.num_layers_in_first_pipeline_stage, " Z ",
      t.num_layers_in_last_pipeline_stage, " N ", n_layers, " |M| ",
      m.moe_layers.size(), " D ", m.num_mtp_layers, m.mtp_routing ? " routed" : "",
      " E ", m.num_experts, " K ", m.topk, " T ",
      t.max_tokens_per_rank, " mbs ", num_mb, " seqs ", k.lengths.size());
  return k;
}

// Stored replay of one sequence (compact layout) and its expected content.
struct Stored {
  int64_t row_offset = 0;
  int64_t num_rows = 0;
  std::vector<uint8_t> valid;
  std::vector<uint8_t> bytes;  // [num_rows, |M| + routed D, K] ids of id_bytes
};

uint32_t ReadId(const uint8_t* p, int id_bytes) {
  if (id_bytes == 1) return *p;
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void WriteId(uint8_t* p, int id_bytes, uint32_t v) {
  if (id_bytes == 1) {
    *p = static_cast<uint8_t>(v);
  } else {
    const uint16_t w = static_cast<uint16_t>(v);
    std::memcpy(p, &w, 2);
  }
}

void CheckCase(const Case& k, uint64_t seed) {
  SCOPED_TRACE(k.describe);
  const Topology& t = k.t;
  const ModelSpec& model = k.model;
  ASSERT_TRUE(ValidateTopologySizes(t).ok()) << ValidateTopologySizes(t);
  auto layout_or = StepLayout::Create(k.plan, k.lengths, t, model);
  ASSERT_TRUE(layout_or.ok()) << layout_or.status();
  const StepLayout& layout = *layout_or;

  // Pipeline layers against the sequential reference.
  const std::vector<std::vector<int>> ref_layers = RefLayers(k.chunk, t.vpp);
  auto assigned = AssignPipelineLayers(model.num_layers, t);
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  std::vector<std::vector<int>> sorted_ref = ref_layers;
  for (auto& v : sorted_ref) std::sort(v.begin(), v.end());
  ASSERT_EQ(*assigned, sorted_ref);
  const std::vector<int> moe = model.ResolvedMoeLayers();
  // Section 10: routed MTP layer d is global layer N + d, stored after M and
  // owned by the last stage.
  const int mtp = model.is_dense() || !model.mtp_routing ? 0 : model.num_mtp_layers;
  const int num_layers = model.num_layers + mtp;
  std::vector<int> moe_pos(num_layers, -1);  // global layer -> stored position
  for (size_t i = 0; i < moe.size(); ++i) moe_pos[moe[i]] = static_cast<int>(i);
  for (int d = 0; d < mtp; ++d) moe_pos[model.num_layers + d] = static_cast<int>(moe.size()) + d;
  std::vector<int> owner(num_layers, -1);
  for (int p = 0; p < t.pp; ++p) {
    std::vector<int> owned = sorted_ref[p];
    if (p == t.pp - 1) {
      for (int d = 0; d < mtp; ++d) owned.push_back(model.num_layers + d);
    }
    for (int l : owned) owner[l] = p;
    const PipelineStage& st = layout.pipeline().stage(p);
    ASSERT_EQ(st.layers, sorted_ref[p]);
    std::vector<int> expect_replay, expect_pos;
    for (int l : owned) {
      if (moe_pos[l] >= 0) {
        expect_replay.push_back(l);
        expect_pos.push_back(moe_pos[l]);
      }
    }
    ASSERT_EQ(st.replay_layers, expect_replay);
    ASSERT_EQ(st.replay_positions, expect_pos);
  }

  // Source data.
  Rng rng(seed ^ 0x9e3779b97f4a7c15ULL);
  const int num_seqs = static_cast<int>(k.lengths.size());
  const int e = model.num_experts, kk = model.topk;
  const int id_bytes = model.stored_id_bytes();
  const int nm = static_cast<int>(moe.size()) + mtp;  // stored layers
  ASSERT_EQ(layout.pipeline().stored_layers(), e == 0 ? 0 : nm);
  std::vector<std::vector<int32_t>> tokens(num_seqs);
  std::vector<std::vector<uint8_t>> field(num_seqs);
  std::vector<Stored> stored(num_seqs);
  // The ragged field: uint16 or int32 ids (the store's two widths).
  const size_t ragged_bytes = seed % 2 == 0 ? 2 : 4;
  std::vector<std::vector<int64_t>> ragged_offsets(num_seqs);
  std::vector<std::vector<uint8_t>> ragged_values(num_seqs);
  for (int i = 0; i < num_seqs; ++i) {
    const int64_t n = k.lengths[i];
    ragged_offsets[i].push_back(0);
    for (int64_t x = 0; x < n; ++x) {
      tokens[i].push_back(TokenOf(i, x));
      for (int b = 0; b < kFieldBytes; ++b) field[i].push_back(FieldByte(i, x, b));
      for (int j = 0; j < RaggedCount(seed, i, x); ++j) {
        const uint32_t v = RaggedValue(i, x, j);
        ragged_values[i].resize(ragged_values[i].size() + ragged_bytes);
        std::memcpy(&ragged_values[i][ragged_values[i].size() - ragged_bytes], &v, ragged_bytes);
      }
      ragged_offsets[i].push_back(static_cast<int64_t>(ragged_values[i].size() / ragged_bytes));
    }
    if (e == 0) continue;
    Stored& s = stored[i];
    const int shape = Uniform(rng, 0, 5);
    s.row_offset = shape == 5 ? Uniform(rng, 0, static_cast<int>(n)) : 0;
    const int64_t end = (shape == 4 || shape == 5) ? n - 1 : n;  // n-1: engines
    s.num_rows = std::max<int64_t>(0, end - s.row_offset);
    if (shape == 3) s.num_rows = 0;
    if (shape == 2) s.row_offset = 0;
    for (int64_t r = 0; r < s.num_rows; ++r) {
      s.valid.push_back(Uniform(rng, 0, 9) == 0 ? 0 : 1);
      for (int l = 0; l < nm; ++l) {
        const int start = Uniform(rng, 0, e - 1);
        const int step = Uniform(rng, 0, 1);  // ids start, start+1.. or random distinct
        std::vector<int> ids;
        if (step == 0) {
          for (int j = 0; j < kk; ++j) ids.push_back((start + j) % e);
        } else {
          std::vector<int> all(e);
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), rng);
          ids.assign(all.begin(), all.begin() + kk);
        }
        for (int j = 0; j < kk; ++j) {
          s.bytes.resize(s.bytes.size() + id_bytes);
          WriteId(&s.bytes[s.bytes.size() - id_bytes], id_bytes, ids[j]);
        }
      }
    }
  }
  auto stored_id = [&](int seq, int64_t pos, int mpos, int j) -> int64_t {
    const Stored& s = stored[seq];
    const int64_t r = pos - s.row_offset;
    if (pos >= k.lengths[seq] || r < 0 || r >= s.num_rows || !s.valid[r]) return -1;
    return ReadId(&s.bytes[((r * nm + mpos) * kk + j) * id_bytes], id_bytes);
  };

  RankMicrobatchLayout rank;  // reused across calls
  for (int mb = 0; mb < layout.num_microbatches(); ++mb) {
    for (const PlanGroup& pg : k.plan.microbatches[mb].groups) {
      const int c = pg.cp_size;
      // Reassembly counters for this group.
      std::map<std::pair<int, int64_t>, int> token_seen;       // (seq,pos)
      std::map<std::tuple<int, int64_t, int>, int> row_seen;   // (seq,pos,layer)
      int64_t padding_rows = 0;
      int64_t sum_padded = 0, sum_real = 0;
      for (size_t j = 0; j < pg.sequences.size(); ++j) {
        sum_padded += pg.padded_lengths[j];
        sum_real += k.lengths[pg.sequences[j]];
        ASSERT_EQ(pg.padded_lengths[j], RefPadded(t, k.lengths[pg.sequences[j]], c));
      }
      for (int lr = 0; lr < c; ++lr) {
        const int rank_id = pg.first_rank + lr;
        const std::vector<RefRow> ref = RefStream(pg, k.lengths, lr);
        std::vector<int32_t> tok0;
        for (int tp = 0; tp < t.tp; ++tp) {
          for (int pp = 0; pp < t.pp; ++pp) {
            const RankCoords coords{rank_id / t.cp, rank_id % t.cp, tp, pp};
            absl::Status st = layout.Describe(coords, mb, &rank);
            ASSERT_TRUE(st.ok()) << st;
            ASSERT_EQ(rank.local_cp_size, c);
            ASSERT_EQ(rank.local_cp_rank, lr);
            ASSERT_EQ(rank.group->sequences, pg.sequences);
            ASSERT_EQ(rank.local_tokens, static_cast<int64_t>(ref.size()));
            ASSERT_LE(rank.local_tokens, t.max_tokens_per_rank);
            ASSERT_EQ(rank.group->cu_seqlens.back(), sum_real);
            ASSERT_EQ(rank.group->cu_seqlens_padded.back(), sum_padded);
            ASSERT_EQ(rank.group->max_seqlen,
                      *std::max_element(pg.padded_lengths.begin(), pg.padded_lengths.end()));

            // Tokens and the 3-byte field, against the reference.
            std::vector<const void*> tsrc, fsrc;
            for (int s : rank.group->sequences) {
              tsrc.push_back(tokens[s].data());
              fsrc.push_back(field[s].data());
            }
            std::vector<int32_t> tok(rank.local_tokens, -7);
            ASSERT_TRUE(GatherRows(rank.token_runs, 4, tsrc,
                                   absl::MakeSpan(reinterpret_cast<uint8_t*>(tok.data()),
                                                  tok.size() * 4))
                            .ok());
            std::vector<uint8_t> fld(rank.local_tokens * kFieldBytes, 0xAB);
            ASSERT_TRUE(
                GatherRows(rank.token_runs, kFieldBytes, fsrc, absl::MakeSpan(fld)).ok());
            for (size_t row = 0; row < ref.size(); ++row) {
              const RefRow& rr = ref[row];
              ASSERT_EQ(tok[row], rr.real ? TokenOf(rr.seq, rr.pos) : 0) << "row " << row;
              for (int b = 0; b < kFieldBytes; ++b) {
                ASSERT_EQ(fld[row * kFieldBytes + b],
                          rr.real ? FieldByte(rr.seq, rr.pos, b) : 0);
              }
            }
            // The ragged field: CSR over the same rows, checked row by row
            // (token rows are the same on every tp and pp rank: checked above).
            if (tp == 0 && pp == 0) {
              auto ragged_source = [&](int ordinal) {
                const int s = rank.group->sequences[ordinal];
                return RaggedSource{ragged_offsets[s], ragged_values[s].data(),
                                    ragged_values[s].size()};
              };
              absl::StatusOr<int64_t> count_values =
                  CountRaggedValues(rank.token_runs, ragged_bytes, ragged_source);
              ASSERT_TRUE(count_values.ok()) << count_values.status();
              std::vector<uint8_t> rvalues(*count_values * ragged_bytes, 0xAB);
              std::vector<int64_t> roffsets(rank.local_tokens + 1, -7);
              absl::Status gathered = GatherRagged(
                  rank.token_runs, ragged_bytes, ragged_source, absl::MakeSpan(rvalues),
                  absl::MakeSpan(reinterpret_cast<uint8_t*>(roffsets.data()),
                                 roffsets.size() * 8));
              ASSERT_TRUE(gathered.ok()) << gathered;
              ASSERT_EQ(roffsets[0], 0);
              for (size_t row = 0; row < ref.size(); ++row) {
                const RefRow& rr = ref[row];
                const int want = rr.real ? RaggedCount(seed, rr.seq, rr.pos) : 0;
                ASSERT_EQ(roffsets[row + 1] - roffsets[row], want) << "ragged row " << row;
                for (int j = 0; j < want; ++j) {
                  uint32_t v = 0;
                  std::memcpy(&v, &rvalues[(roffsets[row] + j) * ragged_bytes], ragged_bytes);
                  ASSERT_EQ(v, RaggedValue(rr.seq, rr.pos, j)) << "ragged row " << row;
                }
              }
              ASSERT_EQ(roffsets.back(), *count_values);
            }

            if (tp == 0 && pp == 0) {
              tok0 = tok;
              // Reassembly from the bytes alone: decode every token.
              for (int32_t v : tok) {
                if (v == 0) {
                  ++padding_rows;
                } else {
                  ++token_seen[{(v - 1) >> 16, (v - 1) & 0xFFFF}];
                }
              }
            } else {
              ASSERT_EQ(tok, tok0);  // same micro-batch on every tp / pp rank
            }

            // Router rows: section 5.
            const bool split = t.sequence_parallel && t.tp > 1;
            const int64_t begin = split ? tp * rank.local_tokens / t.tp : 0;
            const int64_t count = split ? rank.local_tokens / t.tp : rank.local_tokens;
            ASSERT_EQ(rank.router_row_begin, begin);
            ASSERT_EQ(rank.router_rows, count);
            std::vector<int32_t> rtok(count, -7);
            ASSERT_TRUE(GatherRows(rank.router_runs, 4, tsrc,
                                   absl::MakeSpan(reinterpret_cast<uint8_t*>(rtok.data()),
                                                  rtok.size() * 4))
                            .ok());
            ASSERT_TRUE(std::equal(rtok.begin(), rtok.end(), tok.begin() + begin));
            if (e == 0) {
              ASSERT_TRUE(rank.replay_layers.empty());
              continue;
            }
            // Replay.
            const int nl = static_cast<int>(rank.replay_layers.size());
            std::vector<ReplaySource> rsrc;
            for (int s : rank.group->sequences) {
              rsrc.push_back({stored[s].num_rows ? stored[s].bytes.data() : nullptr,
                              stored[s].row_offset, stored[s].num_rows,
                              stored[s].valid.data()});
            }
            ReplaySpec spec{e, kk, id_bytes, nm, rank.replay_positions};
            std::vector<uint8_t> ex(count * nl * kk * id_bytes, 0xCD), mask(count, 0xCD);
            absl::Status rs = GatherReplay(rank.router_runs, spec, rsrc, absl::MakeSpan(ex),
                                           absl::MakeSpan(mask));
            ASSERT_TRUE(rs.ok()) << rs;
            for (int64_t row = 0; row < count; ++row) {
              const RefRow& rr = ref[begin + row];
              // Real, covered by the payload and valid (nm >= 1 for MoE).
              const bool valid = rr.real && stored_id(rr.seq, rr.pos, 0, 0) >= 0;
              ASSERT_EQ(mask[row], valid ? 1 : 0) << "row " << row;
              for (int li = 0; li < nl; ++li) {
                const int layer = rank.replay_layers[li];
                ASSERT_EQ(owner[layer], pp);
                std::vector<uint32_t> ids;
                for (int j = 0; j < kk; ++j) {
                  ids.push_back(ReadId(&ex[((row * nl + li) * kk + j) * id_bytes], id_bytes));
                }
                if (valid) {
                  for (int j = 0; j < kk; ++j) {
                    ASSERT_EQ(ids[j], stored_id(rr.seq, rr.pos, moe_pos[layer], j));
                  }
                  ++row_seen[{rr.seq, rr.pos, layer}];
                } else {
                  std::vector<uint32_t> sorted = ids;
                  std::sort(sorted.begin(), sorted.end());
                  ASSERT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) ==
                              sorted.end())
                      << "filler ids repeat";
                  for (int j = 0; j < kk; ++j) {
                    ASSERT_LT(ids[j], static_cast<uint32_t>(e));
                    ASSERT_EQ(ids[j], static_cast<uint32_t>((rr.q * kk + j) % e));
                  }
                }
              }
            }
          }
        }
      }
      // Every real token exactly once across the group's CP ranks; every
      // padded position accounted for.
      ASSERT_EQ(static_cast<int64_t>(token_seen.size()), sum_real);
      for (const auto& [key, cnt] : token_seen) {
        ASSERT_EQ(cnt, 1) << "token " << key.first << ":" << key.second;
        ASSERT_LT(key.second, k.lengths[key.first]);
      }
      ASSERT_EQ(padding_rows, sum_padded - sum_real);
      if (e == 0) continue;
      // Every valid router row of every MoE layer exactly once per SP split
      // (sp on: across the group's (cp, tp) ranks; sp off: once per tp
      // rank), on the stage owning the layer.
      const int copies = (t.sequence_parallel && t.tp > 1) ? 1 : t.tp;
      int64_t expected_rows = 0;
      for (int s : pg.sequences) {
        for (int64_t x = 0; x < k.lengths[s]; ++x) {
          if (stored_id(s, x, 0, 0) >= 0) expected_rows += nm;
        }
      }
      ASSERT_EQ(static_cast<int64_t>(row_seen.size()), expected_rows);
      for (const auto& [key, cnt] : row_seen) ASSERT_EQ(cnt, copies);
    }
  }
}

TEST(LayoutProperty, RandomTopologiesAndPlans) {
  constexpr int kCases = 400;
  int dynamic = 0, sp_split = 0, vpp = 0, fz = 0, dense = 0, uint16 = 0, multi_group = 0;
  int mtp_routed = 0, mtp_live = 0;
  for (int i = 0; i < kCases; ++i) {
    const uint64_t seed = 1000 + i;
    const Case k = RandomCase(seed);
    dynamic += k.t.scheduler == SchedulerKind::kDynamicCp;
    sp_split += k.t.sequence_parallel && k.t.tp > 1;
    vpp += k.t.vpp > 1;
    fz += k.t.num_layers_in_first_pipeline_stage + k.t.num_layers_in_last_pipeline_stage > 0;
    dense += k.model.is_dense();
    uint16 += k.model.num_experts > 256;
    mtp_routed += k.model.mtp_routing;
    mtp_live += k.model.num_mtp_layers > 0 && !k.model.mtp_routing;
    for (const auto& mb : k.plan.microbatches) {
      for (const auto& g : mb.groups) multi_group += g.cp_size > 1 && g.sequences.size() > 1;
    }
    CheckCase(k, seed);
    if (HasFatalFailure()) return;
  }
  // The generator must actually cover the interesting cases.
  EXPECT_GT(dynamic, kCases / 4);
  EXPECT_GT(sp_split, kCases / 4);
  EXPECT_GT(vpp, kCases / 10);
  EXPECT_GT(fz, kCases / 10);
  EXPECT_GT(dense, 5);
  EXPECT_GT(uint16, 20);
  EXPECT_GT(multi_group, kCases / 4);
  EXPECT_GT(mtp_routed, kCases / 8);
  EXPECT_GT(mtp_live, 10);
}

}  // namespace
}  // namespace rollpack
