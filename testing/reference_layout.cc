#include "testing/reference_layout.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace rollpack {
namespace {

int64_t RoundUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

int64_t Alignment(const v1::Topology& t, int c) {
  const int64_t s = t.sequence_parallel() ? t.tp() : 1;
  const int64_t base = c > 1 ? 2 * c * s : s;
  return std::lcm(base, int64_t{std::max(1, t.pad_multiple())});
}

int64_t ReadId(const v1::NDArray& a, int64_t i) {
  const char* d = a.data().data();
  switch (a.dtype()) {
    case v1::UINT8:
      return static_cast<uint8_t>(d[i]);
    case v1::UINT16: {
      uint16_t v;
      std::memcpy(&v, d + 2 * i, 2);
      return v;
    }
    case v1::INT16: {
      int16_t v;
      std::memcpy(&v, d + 2 * i, 2);
      return v;
    }
    default: {
      int32_t v;
      std::memcpy(&v, d + 4 * i, 4);
      return v;
    }
  }
}

// Element i of a 1-D integer array as a producer sends a ragged field's
// values or offsets (section 13: uint16, int32 or int64).
int64_t ReadInteger(const v1::NDArray& a, int64_t i) {
  const char* d = a.data().data();
  switch (a.dtype()) {
    case v1::UINT16: {
      uint16_t v;
      std::memcpy(&v, d + 2 * i, 2);
      return v;
    }
    case v1::INT64: {
      int64_t v;
      std::memcpy(&v, d + 8 * i, 8);
      return v;
    }
    default: {
      int32_t v;
      std::memcpy(&v, d + 4 * i, 4);
      return v;
    }
  }
}

// Section 13: ragged ids are kept as uint16 when 0 < V <= 65536, else int32.
bool NarrowRaggedIds(const v1::ModelSpec& model) {
  return model.vocab_size() > 0 && model.vocab_size() <= 65536;
}

void AppendRaggedId(int64_t id, bool narrow, std::string* out) {
  if (narrow) {
    const uint16_t v = static_cast<uint16_t>(id);
    out->append(reinterpret_cast<const char*>(&v), 2);
  } else {
    const int32_t v = static_cast<int32_t>(id);
    out->append(reinterpret_cast<const char*>(&v), 4);
  }
}

std::vector<int> MoeLayers(const v1::ModelSpec& model) {
  std::vector<int> m(model.moe_layers().begin(), model.moe_layers().end());
  if (m.empty() && model.num_experts() > 0) {
    m.resize(model.num_layers());
    std::iota(m.begin(), m.end(), 0);
  }
  return m;
}

}  // namespace

std::vector<int> ReferenceStageLayers(int n, const v1::Topology& t, int pp_rank) {
  const int pp = std::max(1, t.pp());
  const int vpp = std::max(1, t.vpp());
  const int f = t.num_layers_in_first_pipeline_stage();
  const int z = t.num_layers_in_last_pipeline_stage();
  std::vector<int> per_stage(pp);
  const int middle_stages = pp - (f > 0 ? 1 : 0) - (z > 0 ? 1 : 0);
  const int middle_layers = n - f - z;
  for (int p = 0; p < pp; ++p) {
    if (p == 0 && f > 0) {
      per_stage[p] = f;
    } else if (p == pp - 1 && z > 0) {
      per_stage[p] = z;
    } else {
      per_stage[p] = middle_stages > 0 ? middle_layers / middle_stages : 0;
    }
  }
  int per_round = 0;
  for (int c : per_stage) per_round += c / vpp;
  std::vector<int> owned;
  for (int v = 0; v < vpp; ++v) {
    int start = v * per_round;
    for (int q = 0; q < pp_rank; ++q) start += per_stage[q] / vpp;
    for (int i = 0; i < per_stage[pp_rank] / vpp; ++i) owned.push_back(start + i);
  }
  std::sort(owned.begin(), owned.end());
  return owned;
}

absl::StatusOr<ExpectedMicrobatch> ReferenceMicrobatch(
    const v1::Plan& plan, const v1::ModelSpec& model,
    const std::map<std::string, const v1::Sample*>& samples, const v1::RankCoords& rank,
    int index) {
  const v1::Topology& t = plan.topology();
  if (index < 0 || index >= plan.microbatches_size()) {
    return absl::OutOfRangeError(absl::StrCat("reference: micro-batch ", index));
  }
  const int id = rank.dp() * t.cp() + rank.cp();
  const v1::RankGroup* group = nullptr;
  for (const v1::RankGroup& g : plan.microbatches(index).groups()) {
    if (id >= g.first_rank() && id < g.first_rank() + g.cp_size()) group = &g;
  }
  if (group == nullptr) return absl::InternalError(absl::StrCat("reference: no group for rank ", id));
  const int c = group->cp_size();
  const int r = id - group->first_rank();
  ExpectedMicrobatch out;
  out.local_cp_size = c;
  out.local_cp_rank = r;
  out.sample_ids.assign(group->sample_ids().begin(), group->sample_ids().end());

  struct Pos {
    const v1::Sample* sample;
    int64_t pos;  // position within the padded sequence
    int64_t q;    // position in the micro-batch's padded stream
  };
  std::vector<Pos> local;
  out.cu_seqlens.push_back(0);
  out.cu_seqlens_padded.push_back(0);
  int64_t stream_offset = 0;
  for (const std::string& sid : out.sample_ids) {
    auto it = samples.find(sid);
    if (it == samples.end()) return absl::NotFoundError(absl::StrCat("reference: sample ", sid));
    const v1::Sample* s = it->second;
    for (const auto& [name, field] : s->ragged_token_fields()) {
      ExpectedRagged& ragged = out.ragged_fields[name];
      ragged.dtype = NarrowRaggedIds(model) ? v1::UINT16 : v1::INT32;
      ragged.offsets = {0};
    }
    const int64_t n = s->tokens().shape(0);
    const int64_t p = RoundUp(n, Alignment(t, c));
    out.cu_seqlens.push_back(static_cast<int32_t>(out.cu_seqlens.back() + n));
    out.cu_seqlens_padded.push_back(static_cast<int32_t>(out.cu_seqlens_padded.back() + p));
    out.max_seqlen = std::max<int32_t>(out.max_seqlen, static_cast<int32_t>(p));
    if (c == 1) {
      for (int64_t i = 0; i < p; ++i) local.push_back({s, i, stream_offset + i});
    } else {
      const int64_t h = p / (2 * c);
      for (int64_t i = r * h; i < (r + 1) * h; ++i) local.push_back({s, i, stream_offset + i});
      for (int64_t i = (2 * c - 1 - r) * h; i < (2 * c - r) * h; ++i) {
        local.push_back({s, i, stream_offset + i});
      }
    }
    stream_offset += p;
  }

  for (const Pos& x : local) {
    const int64_t n = x.sample->tokens().shape(0);
    int32_t token = 0;
    if (x.pos < n) std::memcpy(&token, x.sample->tokens().data().data() + 4 * x.pos, 4);
    out.tokens.push_back(token);
    for (const auto& [name, field] : x.sample->token_fields()) {
      int64_t row = field.data().size() / std::max<int64_t>(1, field.shape(0));
      std::string& dst = out.token_fields[name];
      if (x.pos < n) {
        dst.append(field.data().data() + row * x.pos, row);
      } else {
        dst.append(row, '\0');
      }
    }
    // Section 13: the token's list as put; a padding position's is empty.
    for (auto& [name, ragged] : out.ragged_fields) {
      auto field = x.sample->ragged_token_fields().find(name);
      if (x.pos < n && field != x.sample->ragged_token_fields().end()) {
        const int64_t first = ReadInteger(field->second.offsets(), x.pos);
        const int64_t last = ReadInteger(field->second.offsets(), x.pos + 1);
        for (int64_t i = first; i < last; ++i) {
          AppendRaggedId(ReadInteger(field->second.values(), i), NarrowRaggedIds(model),
                         &ragged.values);
        }
      }
      ragged.offsets.push_back(static_cast<int64_t>(ragged.values.size()) /
                               (NarrowRaggedIds(model) ? 2 : 4));
    }
  }

  // Router rows (sequence parallel) and replay.
  const int64_t tr = static_cast<int64_t>(local.size());
  int64_t begin = 0, count = tr;
  if (t.sequence_parallel() && t.tp() > 1) {
    count = tr / t.tp();
    begin = rank.tp() * count;
  }
  out.router_rows = count;
  if (model.num_experts() == 0) return out;
  const std::vector<int> moe = MoeLayers(model);
  for (int l : ReferenceStageLayers(model.num_layers(), t, rank.pp())) {
    if (std::find(moe.begin(), moe.end(), l) != moe.end()) out.replay_layers.push_back(l);
  }
  // Section 10: with mtp_routing, MTP layer d is global layer N + d, replayed
  // on the last stage after its decoder layers.
  const int mtp = model.mtp_routing() ? model.num_mtp_layers() : 0;
  std::vector<int> routed = moe;  // every layer whose routing a payload carries
  for (int d = 0; d < mtp; ++d) routed.push_back(model.num_layers() + d);
  if (rank.pp() == std::max(1, t.pp()) - 1) {
    for (int d = 0; d < mtp; ++d) out.replay_layers.push_back(model.num_layers() + d);
  }
  const int k = model.topk();
  const int e = model.num_experts();
  for (int64_t row = begin; row < begin + count; ++row) {
    const Pos& x = local[row];
    const v1::NDArray& re = x.sample->routed_experts();
    const int64_t n = x.sample->tokens().shape(0);
    const int64_t off = x.sample->routed_experts_row_offset();
    const int64_t rows = re.shape(0);
    const int64_t payload_layers = re.shape(1);
    const bool full = payload_layers == model.num_layers() + mtp;
    auto payload_index = [&](int l) {
      return full ? l : static_cast<int>(std::find(routed.begin(), routed.end(), l) - routed.begin());
    };
    bool valid = x.pos < n && x.pos >= off && x.pos < off + rows;
    if (valid) {
      bool all_missing = true;
      for (int l : routed) {
        for (int j = 0; j < k; ++j) {
          if (ReadId(re, ((x.pos - off) * payload_layers + payload_index(l)) * k + j) != -1) {
            all_missing = false;
          }
        }
      }
      valid = !all_missing;
    }
    out.replay_mask.push_back(valid ? 1 : 0);
    for (int l : out.replay_layers) {
      for (int j = 0; j < k; ++j) {
        out.replay_experts.push_back(
            valid ? static_cast<int32_t>(ReadId(re, ((x.pos - off) * payload_layers + payload_index(l)) * k + j))
                  : static_cast<int32_t>((x.q * k + j) % e));
      }
    }
  }
  return out;
}

absl::Status CheckMicrobatch(const v1::Microbatch& got, const ExpectedMicrobatch& want,
                             const v1::Topology& t, const v1::RankCoords& rank,
                             const v1::ModelSpec& model, bool all_fields) {
  auto fail = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("rank (dp ", rank.dp(), ", cp ", rank.cp(), ", tp ",
                                            rank.tp(), ", pp ", rank.pp(), ") micro-batch ",
                                            got.index(), ": ", what));
  };
  auto int32s = [](const v1::NDArray& a) {
    std::vector<int32_t> v(a.data().size() / 4);
    if (!v.empty()) std::memcpy(v.data(), a.data().data(), a.data().size());
    return v;
  };
  if (std::vector<std::string>(got.sample_ids().begin(), got.sample_ids().end()) != want.sample_ids) {
    return fail("sample_ids differ");
  }
  if (got.local_cp_size() != want.local_cp_size || got.local_cp_rank() != want.local_cp_rank) {
    return fail(absl::StrCat("local cp ", got.local_cp_rank(), "/", got.local_cp_size(), ", want ",
                             want.local_cp_rank, "/", want.local_cp_size));
  }
  if (got.cu_seqlens().dtype() != v1::INT32 || int32s(got.cu_seqlens()) != want.cu_seqlens) {
    return fail("cu_seqlens differ");
  }
  if (int32s(got.cu_seqlens_padded()) != want.cu_seqlens_padded) return fail("cu_seqlens_padded differ");
  if (got.max_seqlen() != want.max_seqlen) return fail("max_seqlen differs");
  const bool first = rank.pp() == 0, last = rank.pp() == std::max(1, t.pp()) - 1;
  if (first || all_fields) {
    if (got.tokens().dtype() != v1::INT32 || int32s(got.tokens()) != want.tokens) {
      return fail("tokens differ");
    }
  } else if (got.tokens().data().size() != 0) {
    return fail("tokens sent to a middle/last stage");
  }
  if (last || all_fields) {
    if (static_cast<size_t>(got.token_fields_size()) != want.token_fields.size()) {
      return fail("token field count differs");
    }
    for (const auto& [name, bytes] : want.token_fields) {
      auto it = got.token_fields().find(name);
      if (it == got.token_fields().end() || it->second.data() != bytes) {
        return fail(absl::StrCat("token field ", name, " differs"));
      }
    }
    if (static_cast<size_t>(got.ragged_token_fields_size()) != want.ragged_fields.size()) {
      return fail(absl::StrCat(got.ragged_token_fields_size(), " ragged token fields, want ",
                               want.ragged_fields.size()));
    }
    for (const auto& [name, ragged] : want.ragged_fields) {
      auto it = got.ragged_token_fields().find(name);
      if (it == got.ragged_token_fields().end()) {
        return fail(absl::StrCat("ragged token field ", name, " missing"));
      }
      const v1::NDArray& values = it->second.values();
      const v1::NDArray& offsets = it->second.offsets();
      const int64_t count = static_cast<int64_t>(ragged.offsets.back());
      if (values.dtype() != ragged.dtype || values.shape_size() != 1 ||
          values.shape(0) != count || values.data() != ragged.values) {
        return fail(absl::StrCat("ragged token field ", name, "'s values differ"));
      }
      const std::string want_offsets(reinterpret_cast<const char*>(ragged.offsets.data()),
                                     ragged.offsets.size() * 8);
      if (offsets.dtype() != v1::INT64 || offsets.shape_size() != 1 ||
          offsets.shape(0) != static_cast<int64_t>(ragged.offsets.size()) ||
          offsets.data() != want_offsets) {
        return fail(absl::StrCat("ragged token field ", name, "'s offsets differ"));
      }
    }
  } else if (got.token_fields_size() != 0 || got.ragged_token_fields_size() != 0) {
    return fail("token fields sent to a non-last stage");
  }
  if (std::vector<int>(got.replay_layers().begin(), got.replay_layers().end()) != want.replay_layers) {
    return fail("replay_layers differ");
  }
  if (model.num_experts() == 0) return absl::OkStatus();
  const v1::NDArray& re = got.replay_experts();
  const bool narrow = model.num_experts() <= 256;
  if (re.dtype() != (narrow ? v1::UINT8 : v1::UINT16) || re.shape_size() != 3 ||
      re.shape(0) != want.router_rows ||
      re.shape(1) != static_cast<int64_t>(want.replay_layers.size()) || re.shape(2) != model.topk()) {
    return fail("replay_experts dtype or shape differs");
  }
  for (size_t i = 0; i < want.replay_experts.size(); ++i) {
    if (ReadId(re, static_cast<int64_t>(i)) != want.replay_experts[i]) {
      return fail(absl::StrCat("replay_experts element ", i, " is ", ReadId(re, i), ", want ",
                               want.replay_experts[i]));
    }
  }
  const std::string mask(want.replay_mask.begin(), want.replay_mask.end());
  if (got.replay_mask().dtype() != v1::UINT8 || got.replay_mask().data() != mask) {
    return fail("replay_mask differs");
  }
  return absl::OkStatus();
}

}  // namespace rollpack
