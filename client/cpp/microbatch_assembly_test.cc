// AssembleMicrobatch against the micro-batch it came from: random
// micro-batches split into pieces by random row ownership, as FetchPieces
// sends them (trainer.proto, PieceRows), serialized, cut into slices,
// parsed, assembled, and compared to the original (ToMessage, CopyData);
// then every refusal.
#include "client/cpp/microbatch_assembly.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/ragged_field.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/wire/deterministic_bytes.h"

namespace rollpack {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Bytes(std::mt19937& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

v1::NDArray Array(std::mt19937& rng, v1::DType dtype, std::vector<int64_t> shape, int elem) {
  v1::NDArray a;
  a.set_dtype(dtype);
  int64_t n = 1;
  for (int64_t d : shape) {
    a.add_shape(d);
    n *= d;
  }
  a.set_data(Bytes(rng, static_cast<size_t>(n * elem)));
  return a;
}

// A ragged field as the server delivers it (layout.md section 13): a list
// of 0..`most` ids per row (a third of them empty, as padding rows are),
// offsets int64 [rows + 1] from 0.
v1::RaggedArray RandomRagged(std::mt19937& rng, int rows, v1::DType dtype, int most) {
  const int item = dtype == v1::UINT16 ? 2 : 4;
  std::vector<int64_t> offsets{0};
  for (int r = 0; r < rows; ++r) {
    offsets.push_back(offsets.back() +
                      (rng() % 3 == 0 ? 0 : static_cast<int64_t>(rng() % (most + 1))));
  }
  v1::RaggedArray a;
  a.mutable_values()->set_dtype(dtype);
  a.mutable_values()->add_shape(offsets.back());
  a.mutable_values()->set_data(Bytes(rng, static_cast<size_t>(offsets.back() * item)));
  a.mutable_offsets()->set_dtype(v1::INT64);
  a.mutable_offsets()->add_shape(rows + 1);
  a.mutable_offsets()->set_data(
      std::string(reinterpret_cast<const char*>(offsets.data()), offsets.size() * 8));
  return a;
}

std::vector<int64_t> OffsetsOf(const v1::RaggedArray& a) {
  std::vector<int64_t> offsets(a.offsets().data().size() / 8);
  std::memcpy(offsets.data(), a.offsets().data().data(), a.offsets().data().size());
  return offsets;
}

void SetOffsets(v1::RaggedArray* a, const std::vector<int64_t>& offsets) {
  a->mutable_offsets()->clear_shape();
  a->mutable_offsets()->add_shape(static_cast<int64_t>(offsets.size()));
  a->mutable_offsets()->set_data(
      std::string(reinterpret_cast<const char*>(offsets.data()), offsets.size() * 8));
}

// The lists of the rows `spans` lists, as a piece carries them: offsets from
// 0 over those rows, their values concatenated.
v1::RaggedArray RaggedRows(const v1::RaggedArray& a, const std::vector<int64_t>& spans) {
  const std::vector<int64_t> offsets = OffsetsOf(a);
  const size_t item = a.values().dtype() == v1::UINT16 ? 2 : 4;
  std::vector<int64_t> out{0};
  std::string values;
  for (size_t i = 0; i < spans.size(); i += 2) {
    for (int64_t r = spans[i]; r < spans[i] + spans[i + 1]; ++r) {
      const int64_t begin = offsets[static_cast<size_t>(r)];
      const int64_t end = offsets[static_cast<size_t>(r) + 1];
      values.append(a.values().data(), static_cast<size_t>(begin) * item,
                    static_cast<size_t>(end - begin) * item);
      out.push_back(out.back() + end - begin);
    }
  }
  v1::RaggedArray piece = a;
  piece.mutable_values()->set_shape(0, out.back());
  piece.mutable_values()->set_data(values);
  SetOffsets(&piece, out);
  return piece;
}

// A micro-batch of `tokens` token rows and `router` router rows; `layers`
// may be 0 (replay_experts of zero bytes per row).
v1::Microbatch RandomMicrobatch(std::mt19937& rng, int tokens, int router, int layers,
                                bool with_fields) {
  v1::Microbatch m;
  m.set_step_id("step-7");
  m.set_index(3);
  m.set_num_microbatches(9);
  m.set_local_cp_size(2);
  m.set_local_cp_rank(1);
  m.add_sample_ids("s1");
  m.add_sample_ids("s17");
  *m.mutable_cu_seqlens() = Array(rng, v1::INT32, {3}, 4);
  *m.mutable_cu_seqlens_padded() = Array(rng, v1::INT32, {3}, 4);
  m.set_max_seqlen(tokens);
  *m.mutable_tokens() = Array(rng, v1::INT32, {tokens}, 4);
  if (with_fields) {
    (*m.mutable_token_fields())["logprobs"] = Array(rng, v1::FLOAT32, {tokens}, 4);
    (*m.mutable_token_fields())["loss_mask"] = Array(rng, v1::UINT8, {tokens}, 1);
    (*m.mutable_token_fields())["pairs"] = Array(rng, v1::INT16, {tokens, 3}, 2);
    (*m.mutable_ragged_token_fields())["sampling_mask"] =
        RandomRagged(rng, tokens, rng() % 2 == 0 ? v1::UINT16 : v1::INT32, 9);
    (*m.mutable_ragged_token_fields())["top_ids"] = RandomRagged(rng, tokens, v1::INT32, 2);
  }
  const bool u16 = rng() % 2 == 0;
  *m.mutable_replay_experts() =
      Array(rng, u16 ? v1::UINT16 : v1::UINT8, {router, layers, 6}, u16 ? 2 : 1);
  *m.mutable_replay_mask() = Array(rng, v1::UINT8, {router}, 1);
  for (int l = 0; l < layers; ++l) m.add_replay_layers(3 + l);
  m.set_workload(1234.5);
  // Per sequence (lifecycle.md section 6): held whole in meta(), the
  // header piece's alone on FetchPieces streams.
  m.add_group_ids("q0");
  m.add_group_ids("");
  m.add_policy_versions(3);
  m.add_policy_versions(-1);
  (*m.mutable_scalars())["reward"] = Array(rng, v1::FLOAT64, {2}, 8);
  (*m.mutable_scalars())["len_penalty"] = Array(rng, v1::FLOAT64, {2}, 8);
  *m.mutable_advantages() = Array(rng, v1::FLOAT32, {2}, 4);
  return m;
}

std::string MemberAddress(int member) { return absl::StrCat("10.0.0.", member, ":4242"); }

// Random runs of rows, each owned by a member in [lo, members).
std::vector<int> RandomOwners(std::mt19937& rng, int rows, int lo, int members) {
  std::vector<int> owner;
  while (static_cast<int>(owner.size()) < rows) {
    const int run = 1 + static_cast<int>(rng() % 40);
    const int who = lo + static_cast<int>(rng() % (members - lo));
    for (int i = 0; i < run && static_cast<int>(owner.size()) < rows; ++i) owner.push_back(who);
  }
  return owner;
}

// `member`'s rows as (first, count) pairs: maximal runs; when `vary`, some
// cut in two, with an occasional empty pair (valid: it lists no rows).
std::vector<int64_t> Spans(std::mt19937& rng, const std::vector<int>& owner, int member,
                           bool vary) {
  std::vector<int64_t> spans;
  for (size_t r = 0; r < owner.size();) {
    if (owner[r] != member) {
      ++r;
      continue;
    }
    size_t end = r;
    while (end < owner.size() && owner[end] == member) ++end;
    const int64_t n = static_cast<int64_t>(end - r);
    if (vary && n > 1 && rng() % 4 == 0) {
      const int64_t cut = 1 + static_cast<int64_t>(rng() % (n - 1));
      spans.insert(spans.end(), {static_cast<int64_t>(r), cut, static_cast<int64_t>(r) + cut,
                                 n - cut});
    } else {
      spans.insert(spans.end(), {static_cast<int64_t>(r), n});
    }
    if (vary && rng() % 8 == 0) spans.insert(spans.end(), {static_cast<int64_t>(end), 0});
    r = end;
  }
  return spans;
}

// The rows of `a` listed by `spans`, concatenated.
std::string Rows(const v1::NDArray& a, const std::vector<int64_t>& spans) {
  if (a.shape_size() == 0 || a.shape(0) == 0) return "";
  const size_t row = a.data().size() / static_cast<size_t>(a.shape(0));
  std::string out;
  for (size_t i = 0; i < spans.size(); i += 2) {
    out.append(a.data(), static_cast<size_t>(spans[i]) * row,
               static_cast<size_t>(spans[i + 1]) * row);
  }
  return out;
}

struct Split {
  v1::Microbatch header;
  std::vector<v1::Microbatch> pieces;
};

// `m` in pieces as FetchPieces sends them: member 0 the header (every
// field, its own rows), each other member with rows a piece of its own
// rows. When `vary`, a piece without rows of a kind that others have rows of
// sometimes leaves that
// kind's arrays out (the server leaves out token fields of samples it does
// not hold), and spans are cut (Spans).
Split SplitMicrobatch(std::mt19937& rng, const v1::Microbatch& m,
                      const std::vector<int>& token_owner, const std::vector<int>& router_owner,
                      bool vary = true) {
  std::set<int> others;
  for (int o : token_owner) if (o != 0) others.insert(o);
  for (int o : router_owner) if (o != 0) others.insert(o);
  auto piece_of = [&](int member) {
    v1::Microbatch p;
    if (member == 0) {
      p = m;
    } else {
      p.set_step_id(m.step_id());
      p.set_index(m.index());
      p.set_num_microbatches(m.num_microbatches());
    }
    v1::PieceRows* rows = p.mutable_piece();
    const std::vector<int64_t> token = Spans(rng, token_owner, member, vary);
    const std::vector<int64_t> router = Spans(rng, router_owner, member, vary);
    rows->mutable_token_rows()->Assign(token.begin(), token.end());
    rows->mutable_router_rows()->Assign(router.begin(), router.end());
    rows->set_member(MemberAddress(member));
    // Only where some other piece has rows of that kind, and so the arrays.
    const bool no_tokens = vary && !token_owner.empty() &&
                           std::count(token_owner.begin(), token_owner.end(), member) == 0;
    const bool no_router = vary && !router_owner.empty() &&
                           std::count(router_owner.begin(), router_owner.end(), member) == 0;
    if (m.has_tokens() && !(no_tokens && rng() % 2 == 0)) {
      *p.mutable_tokens() = m.tokens();
      p.mutable_tokens()->set_data(Rows(m.tokens(), token));
    } else {
      p.clear_tokens();
    }
    p.clear_token_fields();
    p.clear_ragged_token_fields();
    if (!(no_tokens && rng() % 2 == 0)) {
      for (const auto& [name, a] : m.token_fields()) {
        v1::NDArray& f = (*p.mutable_token_fields())[name];
        f = a;
        f.set_data(Rows(a, token));
      }
      // A piece without token rows may still carry the field: no lists.
      for (const auto& [name, a] : m.ragged_token_fields()) {
        (*p.mutable_ragged_token_fields())[name] = RaggedRows(a, token);
      }
    }
    p.clear_replay_experts();
    p.clear_replay_mask();
    if (!(no_router && rng() % 2 == 0)) {
      if (m.has_replay_experts()) {
        *p.mutable_replay_experts() = m.replay_experts();
        p.mutable_replay_experts()->set_data(Rows(m.replay_experts(), router));
      }
      if (m.has_replay_mask()) {
        *p.mutable_replay_mask() = m.replay_mask();
        p.mutable_replay_mask()->set_data(Rows(m.replay_mask(), router));
      }
    }
    return p;
  };
  Split split;
  split.header = piece_of(0);
  split.header.mutable_piece()->set_header(true);
  for (int o : others) {
    split.header.mutable_piece()->add_members(MemberAddress(o));
    split.pieces.push_back(piece_of(o));
  }
  return split;
}

// `bytes` cut at random offsets into gRPC slices.
grpc::ByteBuffer Buffer(std::mt19937& rng, const std::string& bytes) {
  std::vector<size_t> cuts;
  for (int i = 0; i < 3; ++i) cuts.push_back(bytes.empty() ? 0 : rng() % (bytes.size() + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + at, cut - at);
    at = cut;
  }
  slices.emplace_back(bytes.data() + at, bytes.size() - at);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

ReceivedMicrobatch Received(std::mt19937& rng, const v1::Microbatch& m, int64_t* wire = nullptr) {
  const std::string bytes = DeterministicBytes(m);
  if (wire != nullptr) *wire += static_cast<int64_t>(bytes.size());
  absl::StatusOr<ReceivedMicrobatch> r = ReceivedMicrobatch::Parse(Buffer(rng, bytes));
  EXPECT_TRUE(r.ok()) << r.status();
  return *std::move(r);
}

absl::StatusOr<ReceivedMicrobatch> Assemble(std::mt19937& rng, const Split& split,
                                            int64_t* wire = nullptr) {
  ReceivedMicrobatch header = Received(rng, split.header, wire);
  std::vector<ReceivedMicrobatch> pieces;
  for (const v1::Microbatch& p : split.pieces) pieces.push_back(Received(rng, p, wire));
  return AssembleMicrobatch(std::move(header), std::move(pieces));
}

std::vector<std::pair<std::string, const v1::NDArray*>> ArraysOf(const v1::Microbatch& m) {
  std::vector<std::pair<std::string, const v1::NDArray*>> out;
  if (m.has_tokens()) out.emplace_back("tokens", &m.tokens());
  if (m.has_cu_seqlens()) out.emplace_back("cu_seqlens", &m.cu_seqlens());
  if (m.has_cu_seqlens_padded()) out.emplace_back("cu_seqlens_padded", &m.cu_seqlens_padded());
  if (m.has_replay_experts()) out.emplace_back("replay_experts", &m.replay_experts());
  if (m.has_replay_mask()) out.emplace_back("replay_mask", &m.replay_mask());
  for (const auto& [name, a] : m.token_fields()) out.emplace_back("field:" + name, &a);
  for (const auto& [name, a] : m.ragged_token_fields()) {
    out.emplace_back(RaggedValuesName(name), &a.values());
    out.emplace_back(RaggedOffsetsName(name), &a.offsets());
  }
  return out;
}

void ExpectAssembledEquals(const ReceivedMicrobatch& got, const v1::Microbatch& want,
                           const std::string& what) {
  ASSERT_TRUE(DeterministicBytes(got.ToMessage()) == DeterministicBytes(want)) << what;
  EXPECT_FALSE(got.meta().has_piece()) << what;
  for (const auto& [name, array] : ArraysOf(want)) {
    ASSERT_EQ(got.data_size(name), static_cast<int64_t>(array->data().size())) << what << name;
    std::string out(array->data().size(), '\0');
    got.CopyData(name, out.data());
    EXPECT_TRUE(out == array->data()) << what << " " << name;
  }
  // meta(): everything but the arrays' data.
  v1::Microbatch meta = want;
  for (v1::NDArray* a : {meta.mutable_tokens(), meta.mutable_cu_seqlens(),
                         meta.mutable_cu_seqlens_padded(), meta.mutable_replay_experts(),
                         meta.mutable_replay_mask()}) {
    a->clear_data();
  }
  for (auto& [name, a] : *meta.mutable_token_fields()) a.clear_data();
  for (auto& [name, a] : *meta.mutable_ragged_token_fields()) {
    a.mutable_values()->clear_data();
    a.mutable_offsets()->clear_data();
  }
  for (v1::Microbatch* m : {&meta}) {
    if (!want.has_tokens()) m->clear_tokens();
    if (!want.has_replay_experts()) m->clear_replay_experts();
    if (!want.has_replay_mask()) m->clear_replay_mask();
  }
  EXPECT_TRUE(DeterministicBytes(got.meta()) == DeterministicBytes(meta)) << what;
}

TEST(MicrobatchAssemblyTest, RandomSplitsAssembleToTheOriginal) {
  std::mt19937 rng(19);
  for (int trial = 0; trial < 600; ++trial) {
    const int tokens = trial % 50 == 0 ? 0 : static_cast<int>(rng() % 300);
    const int router = trial % 70 == 0 ? 0 : static_cast<int>(rng() % 300);
    const int layers = trial % 9 == 0 ? 0 : 1 + static_cast<int>(rng() % 4);
    v1::Microbatch m = RandomMicrobatch(rng, tokens, router, layers, trial % 5 != 0);
    if (trial % 11 == 0) m.clear_tokens();  // a later pipeline stage
    const int members = 1 + static_cast<int>(rng() % 5);
    // The header's member holds none of the rows in some trials.
    const int lo = members > 1 && trial % 4 == 0 ? 1 : 0;
    const std::vector<int> token_owner = RandomOwners(rng, tokens, lo, members);
    const std::vector<int> router_owner = RandomOwners(rng, router, lo, members);
    const Split split = SplitMicrobatch(rng, m, token_owner, router_owner);
    int64_t wire = 0;
    absl::StatusOr<ReceivedMicrobatch> got = Assemble(rng, split, &wire);
    const std::string what = absl::StrCat("trial ", trial, " (", split.pieces.size() + 1,
                                          " pieces) ");
    ASSERT_TRUE(got.ok()) << what << got.status();
    EXPECT_EQ(got->wire_bytes(), wire) << what;
    ExpectAssembledEquals(*got, m, what);
    for (const auto& [name, a] : m.ragged_token_fields()) {
      absl::StatusOr<RaggedShape> shape = got->CheckRagged(name);
      ASSERT_TRUE(shape.ok()) << what << shape.status();
      EXPECT_EQ(shape->rows, tokens) << what;
      EXPECT_EQ(shape->num_values, a.values().shape(0)) << what;
    }
    // Moved, it still reads the same slices.
    ReceivedMicrobatch moved = *std::move(got);
    ASSERT_TRUE(DeterministicBytes(moved.ToMessage()) == DeterministicBytes(m)) << what;
  }
}

TEST(MicrobatchAssemblyTest, HeaderAloneIsTheWholeMicrobatch) {
  std::mt19937 rng(5);
  const v1::Microbatch m = RandomMicrobatch(rng, 100, 100, 3, true);
  v1::Microbatch header = m;
  header.mutable_piece()->set_header(true);
  header.mutable_piece()->add_token_rows(0);
  header.mutable_piece()->add_token_rows(100);
  header.mutable_piece()->add_router_rows(0);
  header.mutable_piece()->add_router_rows(100);
  absl::StatusOr<ReceivedMicrobatch> got = AssembleMicrobatch(Received(rng, header), {});
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectAssembledEquals(*got, m, "header alone");
}

// Group ids, versions, scalars and advantages travel in the header piece
// alone (trainer.proto): a three-member assembly hands them out as sent.
TEST(MicrobatchAssemblyTest, PerSequenceFieldsComeFromTheHeader) {
  std::mt19937 rng(11);
  const v1::Microbatch m = RandomMicrobatch(rng, 60, 60, 2, true);
  std::vector<int> owner(60);
  for (int r = 0; r < 60; ++r) owner[r] = r / 20;
  const Split split = SplitMicrobatch(rng, m, owner, owner, /*vary=*/false);
  for (const v1::Microbatch& p : split.pieces) {
    ASSERT_EQ(p.group_ids_size() + p.policy_versions_size() + p.scalars_size(), 0);
    ASSERT_FALSE(p.has_advantages());
  }
  absl::StatusOr<ReceivedMicrobatch> got = Assemble(rng, split);
  ASSERT_TRUE(got.ok()) << got.status();
  absl::StatusOr<SequenceMetadata> seq = got->sequences();
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_TRUE(seq->sent);
  EXPECT_EQ(seq->group_ids, (std::vector<std::string>{"q0", ""}));
  EXPECT_EQ(seq->policy_versions, (std::vector<int64_t>{3, -1}));
  ASSERT_EQ(seq->scalars.size(), 2u);
  ASSERT_TRUE(seq->has_advantages);
  ASSERT_EQ(seq->advantages.size(), 2u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(seq->advantages.data()), 8),
            m.advantages().data());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(seq->scalars.at("reward").data()), 16),
            m.scalars().at("reward").data());
}

// A valid three-member split of a 60-row micro-batch (members 0, 1, 2 own
// rows [0, 20), [20, 40), [40, 60) of both kinds), changed by `mutate`,
// must be refused with DATA_LOSS and a message holding `parts`.
void ExpectRefused(const std::function<void(Split*)>& mutate,
                   const std::vector<std::string>& parts) {
  std::mt19937 rng(7);
  const v1::Microbatch m = RandomMicrobatch(rng, 60, 60, 2, true);
  std::vector<int> owner(60);
  for (int r = 0; r < 60; ++r) owner[r] = r / 20;
  Split split = SplitMicrobatch(rng, m, owner, owner, /*vary=*/false);
  ASSERT_TRUE(Assemble(rng, split).ok());
  mutate(&split);
  absl::StatusOr<ReceivedMicrobatch> got = Assemble(rng, split);
  ASSERT_FALSE(got.ok()) << "accepted, expected: " << ::testing::PrintToString(parts);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(part));
  }
}

TEST(MicrobatchAssemblyTest, RefusesPiecesInTheWrongPlace) {
  ExpectRefused([](Split* s) { s->header.clear_piece(); },
                {"the member dialled", "micro-batch 3", "without `piece`"});
  ExpectRefused([](Split* s) { s->header.mutable_piece()->set_header(false); },
                {"member 10.0.0.0:4242", "without piece.header"});
  ExpectRefused([](Split* s) { s->pieces[1].mutable_piece()->set_header(true); },
                {"member 10.0.0.2:4242", "micro-batch 3", "a header piece where its own"});
  ExpectRefused([](Split* s) { s->pieces[0].clear_piece(); },
                {"member 10.0.0.1:4242", "without `piece`"});
  ExpectRefused([](Split* s) { s->pieces.pop_back(); },
                {"lists 2 other members", "10.0.0.1:4242, 10.0.0.2:4242", "1 pieces"});
  ExpectRefused([](Split* s) { std::swap(s->pieces[0], s->pieces[1]); },
                {"member 10.0.0.1:4242", "piece.member is \"10.0.0.2:4242\""});
  ExpectRefused([](Split* s) { s->pieces[0].set_step_id("other"); },
                {"member 10.0.0.1:4242", "a piece of step \"other\""});
  ExpectRefused([](Split* s) { s->pieces[1].set_index(4); },
                {"member 10.0.0.2:4242", "micro-batch 3", "a piece of micro-batch 4"});
  ExpectRefused([](Split* s) { s->pieces[1].set_num_microbatches(8); },
                {"member 10.0.0.2:4242", "num_microbatches 8, the header's 9"});
  ExpectRefused([](Split* s) { *s->pieces[0].mutable_cu_seqlens() = s->header.cu_seqlens(); },
                {"member 10.0.0.1:4242", "cu_seqlens, which only the header piece carries"});
}

TEST(MicrobatchAssemblyTest, RefusesMalformedSpans) {
  ExpectRefused([](Split* s) { s->pieces[0].mutable_piece()->add_token_rows(59); },
                {"member 10.0.0.1:4242", "piece.token_rows has 3 values"});
  ExpectRefused(
      [](Split* s) {
        s->pieces[0].mutable_piece()->set_router_rows(1, -1);
      },
      {"member 10.0.0.1:4242", "router_rows pair 0 (first_row 20, num_rows -1)", "non-negative"});
  ExpectRefused(
      [](Split* s) {
        auto* rows = s->pieces[1].mutable_piece()->mutable_token_rows();
        rows->Clear();
        rows->Add(50);
        rows->Add(10);
        rows->Add(40);
        rows->Add(10);
      },
      {"member 10.0.0.2:4242", "token_rows pair 1 (first_row 40, num_rows 10) starts before row 60",
       "increasing row order"});
  // Rows past the end (and so the data, 21 rows, would not match either).
  ExpectRefused(
      [](Split* s) {
        s->pieces[1].mutable_piece()->set_token_rows(1, 21);
      },
      {"member 10.0.0.2:4242", "micro-batch 3", "token_rows pair 0 (first_row 40, num_rows 21)",
       "of field:logprobs: rows [40, 61) outside the array's [0, 60)"});
}

TEST(MicrobatchAssemblyTest, RefusesRowsOverlappingOrUncovered) {
  // Member 1 claims rows 15..39 (its data grown to match): 15..19 are the header's.
  ExpectRefused(
      [](Split* s) {
        auto* p = s->pieces[0].mutable_piece();
        p->set_token_rows(0, 15);
        p->set_token_rows(1, 25);
        v1::Microbatch& m = s->pieces[0];
        m.mutable_tokens()->mutable_data()->append(5 * 4, 'x');
        for (auto& [name, a] : *m.mutable_token_fields()) {
          a.mutable_data()->append(5 * a.data().size() / 20, 'x');
        }
      },
      {"member 10.0.0.1:4242", "rows [15, 20) of", "come from member 10.0.0.0:4242 too"});
  // Member 2's router rows cut to 40..49 (data cut to match): 50..59 come from nobody.
  ExpectRefused(
      [](Split* s) {
        v1::Microbatch& m = s->pieces[1];
        m.mutable_piece()->set_router_rows(1, 10);
        m.mutable_replay_mask()->mutable_data()->resize(10);
        m.mutable_replay_experts()->mutable_data()->resize(
            m.replay_experts().data().size() / 2);
      },
      {"micro-batch 3", "rows [50, 60) of replay_", "in no piece's router_rows"});
  // The header's token field left out while it holds rows of it.
  ExpectRefused([](Split* s) { s->header.mutable_token_fields()->erase("logprobs"); },
                {"rows [0, 20) of field:logprobs", "in no piece's token_rows",
                 "from member 10.0.0.1:4242, member 10.0.0.2:4242"});
}

TEST(MicrobatchAssemblyTest, RefusesDataSizesAndDisagreeingArrays) {
  ExpectRefused([](Split* s) { s->pieces[0].mutable_tokens()->mutable_data()->push_back('x'); },
                {"member 10.0.0.1:4242", "tokens has 81 bytes of data",
                 "token_rows list 20 rows of 4 bytes = 80"});
  ExpectRefused(
      [](Split* s) {
        (*s->pieces[1].mutable_token_fields())["pairs"].mutable_data()->resize(10);
      },
      {"member 10.0.0.2:4242", "field:pairs has 10 bytes", "20 rows of 6 bytes = 120"});
  ExpectRefused([](Split* s) { s->pieces[0].mutable_replay_mask()->set_dtype(v1::INT16); },
                {"member 10.0.0.1:4242", "replay_mask is INT16 [60]",
                 "member 10.0.0.0:4242 sent it as UINT8 [60]"});
  ExpectRefused([](Split* s) { s->pieces[1].mutable_tokens()->set_shape(0, 61); },
                {"member 10.0.0.2:4242", "tokens is INT32 [61]", "as INT32 [60]"});
  ExpectRefused(
      [](Split* s) {
        for (v1::Microbatch* m : {&s->header, &s->pieces[0], &s->pieces[1]}) {
          m->mutable_replay_mask()->set_dtype(v1::DTYPE_UNSPECIFIED);
        }
      },
      {"replay_mask is DTYPE_UNSPECIFIED [60]", "no element size"});
  ExpectRefused(
      [](Split* s) {
        for (v1::Microbatch* m : {&s->header, &s->pieces[0], &s->pieces[1]}) {
          m->mutable_replay_mask()->clear_shape();
        }
      },
      {"replay_mask is UINT8 [] (no rows) with 20 bytes of data"});
  ExpectRefused(
      [](Split* s) {
        for (v1::Microbatch* m : {&s->header, &s->pieces[0], &s->pieces[1]}) {
          m->mutable_tokens()->set_shape(0, -60);
        }
      },
      {"tokens is INT32 [-60]", "negative dimension"});
}

// Ragged fields (layout.md section 13): a piece whose rows all have empty
// lists (padding), and a piece with no token rows at all that carries the
// field anyway (offsets [1] = {0}), assemble to the original.
TEST(MicrobatchAssemblyTest, RaggedPiecesWithEmptyListsOrNoRows) {
  std::mt19937 rng(23);
  v1::Microbatch m = RandomMicrobatch(rng, 60, 60, 2, true);
  v1::RaggedArray& mask = (*m.mutable_ragged_token_fields())["sampling_mask"];
  // Rows [20, 40), member 1's, get empty lists.
  std::vector<int64_t> offsets = OffsetsOf(mask);
  const size_t item = mask.values().dtype() == v1::UINT16 ? 2 : 4;
  const int64_t cut = offsets[40] - offsets[20];
  std::string values = mask.values().data();
  values.erase(static_cast<size_t>(offsets[20]) * item, static_cast<size_t>(cut) * item);
  for (size_t r = 21; r < offsets.size(); ++r)
    offsets[r] -= r <= 40 ? offsets[r] - offsets[20] : cut;
  mask.mutable_values()->set_shape(0, offsets.back());
  mask.mutable_values()->set_data(values);
  SetOffsets(&mask, offsets);
  std::vector<int> token_owner(60), router_owner(60);
  for (int r = 0; r < 60; ++r) {
    token_owner[r] = r / 20;
    router_owner[r] = r < 50 ? r / 20 : 3;  // member 3: router rows only
  }
  const Split split = SplitMicrobatch(rng, m, token_owner, router_owner, /*vary=*/false);
  ASSERT_EQ(split.pieces.size(), 3u);
  const v1::RaggedArray& empty = split.pieces[0].ragged_token_fields().at("sampling_mask");
  EXPECT_EQ(OffsetsOf(empty), std::vector<int64_t>(21, 0));
  EXPECT_EQ(empty.values().shape(0), 0);
  const v1::RaggedArray& none = split.pieces[2].ragged_token_fields().at("sampling_mask");
  EXPECT_EQ(OffsetsOf(none), std::vector<int64_t>{0});
  absl::StatusOr<ReceivedMicrobatch> got = Assemble(rng, split);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectAssembledEquals(*got, m, "empty lists");
}

// A stage that gets ragged fields but neither tokens nor token fields: the
// rows are those the pieces list, still tiled exactly once.
TEST(MicrobatchAssemblyTest, RaggedFieldsAlone) {
  std::mt19937 rng(29);
  v1::Microbatch m = RandomMicrobatch(rng, 60, 60, 2, true);
  m.clear_tokens();
  m.clear_token_fields();
  std::vector<int> owner(60);
  for (int r = 0; r < 60; ++r) owner[r] = r / 20;
  Split split = SplitMicrobatch(rng, m, owner, owner, /*vary=*/false);
  absl::StatusOr<ReceivedMicrobatch> got = Assemble(rng, split);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectAssembledEquals(*got, m, "ragged alone");

  // Member 2 claims rows 35..59 (its lists grown to match): 35..39 are member 1's.
  v1::Microbatch& p = split.pieces[1];
  p.mutable_piece()->set_token_rows(0, 35);
  p.mutable_piece()->set_token_rows(1, 25);
  for (auto& [name, a] : *p.mutable_ragged_token_fields()) {
    std::vector<int64_t> offsets = OffsetsOf(a);
    offsets.insert(offsets.begin(), 5, 0);
    SetOffsets(&a, offsets);
  }
  got = Assemble(rng, split);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(
      std::string(got.status().message()),
      AllOf(HasSubstr("member 10.0.0.2:4242"), HasSubstr("rows [35, 40) of ragged_token_fields"),
            HasSubstr("(token_rows) come from member 10.0.0.1:4242 too")));
}

// What a piece says about its ragged field is checked before it is trusted:
// forged offsets, counts and dtypes are refused, naming the member.
TEST(MicrobatchAssemblyTest, RefusesForgedRaggedFields) {
  auto mask = [](v1::Microbatch& m) {
    return &(*m.mutable_ragged_token_fields())["sampling_mask"];
  };
  auto forge = [mask](int piece, const std::function<void(std::vector<int64_t>*)>& change) {
    return [=](Split* s) {
      v1::Microbatch& m = piece < 0 ? s->header : s->pieces[static_cast<size_t>(piece)];
      std::vector<int64_t> offsets = OffsetsOf(*mask(m));
      change(&offsets);
      SetOffsets(mask(m), offsets);
    };
  };
  const std::string field = "ragged_token_fields[\"sampling_mask\"]";
  // Row 3's list made to end before it starts (values unchanged).
  ExpectRefused(
      forge(0, [](std::vector<int64_t>* o) { (*o)[4] = (*o)[3] - 1; }),
      {"member 10.0.0.1:4242", "micro-batch 3", field, "offsets[4] is", "below offsets[3]"});
  ExpectRefused(forge(1, [](std::vector<int64_t>* o) { (*o)[0] = 2; }),
                {"member 10.0.0.2:4242", field, "offsets[0] is 2, not 0"});
  ExpectRefused(forge(-1, [](std::vector<int64_t>* o) { (*o)[20] += 1; }),
                {"member 10.0.0.0:4242", field, "offsets[20] is"});
  ExpectRefused(forge(1, [](std::vector<int64_t>* o) { (*o)[5] = int64_t{1} << 40; }),
                {"member 10.0.0.2:4242", field, "offsets[5] is 1099511627776, past the"});
  // The last row's list dropped, consistently: offsets for 19 rows where
  // token_rows list 20.
  ExpectRefused(
      [mask](Split* s) {
        v1::RaggedArray* a = mask(s->pieces[0]);
        std::vector<int64_t> offsets = OffsetsOf(*a);
        offsets.pop_back();
        SetOffsets(a, offsets);
        const size_t item = a->values().dtype() == v1::UINT16 ? 2 : 4;
        a->mutable_values()->set_shape(0, offsets.back());
        a->mutable_values()->mutable_data()->resize(static_cast<size_t>(offsets.back()) * item);
      },
      {"member 10.0.0.1:4242", field, "has offsets for 19 rows", "token_rows list 20"});
  // Data of another size than the shape says.
  ExpectRefused(
      [mask](Split* s) { mask(s->pieces[0])->mutable_offsets()->mutable_data()->resize(7); },
      {"member 10.0.0.1:4242", field, "offsets hold 7 bytes", "21 entries need 168"});
  ExpectRefused(
      [mask](Split* s) { mask(s->pieces[1])->mutable_values()->mutable_data()->append("xx"); },
      {"member 10.0.0.2:4242", field, "values hold"});
  ExpectRefused(
      [mask](Split* s) {
        v1::NDArray* v = mask(s->pieces[1])->mutable_values();
        v->set_dtype(v->dtype() == v1::UINT16 ? v1::INT32 : v1::UINT16);
      },
      {"member 10.0.0.2:4242", field, "sent them as"});
  ExpectRefused([mask](Split* s) { mask(s->pieces[0])->mutable_values()->set_dtype(v1::INT64); },
                {"member 10.0.0.1:4242", field, "values is INT64", "1-D UINT16 or INT32"});
  ExpectRefused([mask](Split* s) { mask(s->pieces[0])->mutable_offsets()->set_dtype(v1::INT32); },
                {"member 10.0.0.1:4242", field, "offsets is INT32 [21]"});
  // A piece holding rows without the field.
  ExpectRefused(
      [](Split* s) { s->pieces[0].mutable_ragged_token_fields()->erase("sampling_mask"); },
      {"rows [20, 40) of", field, "(60 rows) are in no piece's token_rows"});
}

}  // namespace
}  // namespace rollpack
