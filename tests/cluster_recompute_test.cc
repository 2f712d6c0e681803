// R2 over a cluster with real processes (docs/recompute.md, docs/cluster.md):
// ranks upload the routing they recorded through any member, which splits it
// by owner; the commit covers every owner or none; a later RECOMPUTE step
// delivers, through every member and by direct pulls, exactly the bytes one
// rollpackd holding every sample serves after the same uploads; an owner
// that is down is named.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/trainer_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/wire/deterministic_bytes.h"
#include "rollpack/v1/trainer.grpc.pb.h"
#include "testing/cluster_fixture.h"
#include "testing/rank_fetch.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// B: another layout for the replay, so every uploaded row has to be put back
// into its sample and re-sliced (other CP slices, SP router rows).
v1::Topology TopoB() {
  v1::Topology t;
  t.set_dp(1);
  t.set_cp(2);
  t.set_tp(2);
  t.set_pp(2);
  t.set_sequence_parallel(true);
  t.set_max_tokens_per_rank(512);
  t.set_scheduler(v1::STATIC_CP);
  return t;
}

v1::CreateStepRequest StepRequest(const std::string& step_id, const std::vector<std::string>& ids,
                                  const v1::Topology& topology,
                                  v1::ReplaySource source = v1::REPLAY_SOURCE_ROLLOUT) {
  v1::CreateStepRequest request;
  request.set_step_id(step_id);
  request.set_pool("pool");
  for (const std::string& id : ids) request.add_sample_ids(id);
  *request.mutable_topology() = topology;
  // Releasing a step without reuse deletes its samples, and the recompute
  // routing with them (recompute.md, "The commit").
  request.set_reuse_samples(true);
  request.set_replay_source(source);
  return request;
}

std::vector<std::string> Bytes(const std::vector<v1::Microbatch>& mbs) {
  std::vector<std::string> out;
  for (const v1::Microbatch& mb : mbs) out.push_back(DeterministicBytes(mb));
  return out;
}

int64_t MaskOnes(const v1::Microbatch& mb) {
  const std::string& mask = mb.replay_mask().data();
  return std::count(mask.begin(), mask.end(), '\1');
}

// The simplest correct upload: the micro-batch's own replay_experts, as received.
absl::StatusOr<v1::UploadRoutingResponse> Upload(const std::string& address,
                                                 const v1::RankCoords& rank,
                                                 const v1::Microbatch& mb,
                                                 const v1::NDArray* experts = nullptr) {
  v1::RecordedRouting request;
  request.set_step_id(mb.step_id());
  *request.mutable_rank() = rank;
  request.set_index(mb.index());
  *request.mutable_experts() = experts != nullptr ? *experts : mb.replay_experts();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::UploadRoutingResponse response;
  grpc::Status s = v1::Trainer::NewStub(MakeChannel(address))->UploadRouting(&context, request, &response);
  if (!s.ok()) return FromGrpcStatus(s);
  return response;
}

absl::StatusOr<v1::CommitRoutingResponse> Commit(const std::string& address,
                                                 const std::string& step_id) {
  v1::CommitRoutingRequest request;
  request.set_step_id(step_id);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::CommitRoutingResponse response;
  grpc::Status s = v1::Trainer::NewStub(MakeChannel(address))->CommitRouting(&context, request, &response);
  if (!s.ok()) return FromGrpcStatus(s);
  return response;
}

bool NamesOneOf(const absl::Status& status, const std::set<std::string>& ids) {
  for (const std::string& id : ids) {
    if (absl::StrContains(status.message(), absl::StrCat("\"", id, "\""))) return true;
  }
  return false;
}

class ClusterRecomputeTest : public ClusterFixture {
 protected:
  std::string Address(size_t i) const { return members_[i]->address(); }
};

TEST_F(ClusterRecomputeTest, UploadsThroughAnyMemberComeBackAsOnASingleServer) {
  StartThreeWithSamples();
  std::unique_ptr<DaemonProcess> single = StartReference();
  ASSERT_NE(single, nullptr);
  RollpackClient reference(MakeChannel(single->address()));
  const std::vector<std::string> ids = InterleavedIds(6);
  ASSERT_TRUE(Client(1).CreateStep(StepRequest("rec", ids, HybridTopology())).ok());
  ASSERT_TRUE(reference.CreateStep(StepRequest("rec", ids, HybridTopology())).ok());

  const std::vector<v1::RankCoords> ranks = AllRanks(HybridTopology());
  std::vector<std::vector<v1::Microbatch>> got(ranks.size()), want(ranks.size());
  int64_t rollout_ones = 0;  // replayable rows of stage 0: each real token at most once
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StatusOr<std::vector<v1::Microbatch>> c =
        FetchRankMicrobatches(Address(r % 3), "rec", ranks[r], Delivery::kProxy);
    absl::StatusOr<std::vector<v1::Microbatch>> s =
        FetchRankMicrobatches(single->address(), "rec", ranks[r], Delivery::kProxy);
    ASSERT_TRUE(c.ok() && s.ok()) << c.status() << " / " << s.status();
    ASSERT_EQ(Bytes(*c), Bytes(*s)) << "rank " << r;
    got[r] = *std::move(c);
    want[r] = *std::move(s);
    if (ranks[r].pp() == 0) {
      for (const v1::Microbatch& mb : got[r]) rollout_ones += MaskOnes(mb);
    }
  }

  // Same uploads in the same order: the same rows and repeated rows as the
  // single server's answers.
  int64_t rows = 0;
  std::optional<v1::UploadRoutingResponse> last;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (r + 1 == ranks.size()) {
      // The last rank's rows are still missing: refused, naming a sample.
      absl::StatusOr<v1::CommitRoutingResponse> early = Commit(Address(1), "rec");
      EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
      EXPECT_THAT(std::string(early.status().message()), HasSubstr("was not uploaded"));
      EXPECT_TRUE(NamesOneOf(early.status(), {ids.begin(), ids.end()})) << early.status();
    }
    for (size_t i = 0; i < got[r].size(); ++i) {
      absl::StatusOr<v1::UploadRoutingResponse> c = Upload(Address(r % 3), ranks[r], got[r][i]);
      absl::StatusOr<v1::UploadRoutingResponse> s = Upload(single->address(), ranks[r], want[r][i]);
      ASSERT_TRUE(c.ok()) << "rank " << r << " micro-batch " << i << ": " << c.status();
      ASSERT_TRUE(s.ok()) << s.status();
      const std::string where = absl::StrCat("rank ", r, " micro-batch ", i, ": ",
                                             c->ShortDebugString(), " vs ", s->ShortDebugString());
      EXPECT_EQ(c->rows(), s->rows()) << where;
      EXPECT_EQ(c->repeated_rows(), s->repeated_rows()) << where;
      // In a cluster: what is missing on the members this upload reached
      // (recompute.md, "In a cluster"), never more than the whole step's.
      EXPECT_LE(c->missing_entries(), s->missing_entries()) << where;
      rows += c->rows();
      last = *c;
    }
  }
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->missing_entries(), 0);
  EXPECT_GT(rows, 0);
  // A retry through another member: every row repeated, as on one server.
  absl::StatusOr<v1::UploadRoutingResponse> retry = Upload(Address(1), ranks[0], got[0][0]);
  absl::StatusOr<v1::UploadRoutingResponse> retry_want =
      Upload(single->address(), ranks[0], want[0][0]);
  ASSERT_TRUE(retry.ok() && retry_want.ok()) << retry.status() << " / " << retry_want.status();
  EXPECT_EQ(retry->repeated_rows(), retry->rows());
  EXPECT_EQ(DeterministicBytes(*retry), DeterministicBytes(*retry_want));

  absl::StatusOr<v1::CommitRoutingResponse> committed = Commit(Address(2), "rec");
  absl::StatusOr<v1::CommitRoutingResponse> committed_want = Commit(single->address(), "rec");
  ASSERT_TRUE(committed.ok()) << committed.status();
  ASSERT_TRUE(committed_want.ok()) << committed_want.status();
  EXPECT_EQ(committed->samples(), static_cast<int>(ids.size()));
  EXPECT_EQ(committed->ShortDebugString(), committed_want->ShortDebugString());
  // A retried commit (its answer lost) answers as the first, through any member.
  absl::StatusOr<v1::CommitRoutingResponse> again = Commit(Address(0), "rec");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ShortDebugString(), committed->ShortDebugString());
  // The rollout left rows out (the last token, missing rows); the recompute
  // covers every real token, so the replay below must differ from R3.
  EXPECT_LT(rollout_ones, committed->tokens());

  ASSERT_TRUE(Client(0).ReleaseStep("rec").ok());
  ASSERT_TRUE(reference.ReleaseStep("rec").ok());
  absl::StatusOr<v1::StepInfo> info =
      Client(2).CreateStep(StepRequest("rec2", ids, TopoB(), v1::REPLAY_SOURCE_RECOMPUTE));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->replay_source(), v1::REPLAY_SOURCE_RECOMPUTE);
  ASSERT_TRUE(
      reference.CreateStep(StepRequest("rec2", ids, TopoB(), v1::REPLAY_SOURCE_RECOMPUTE)).ok());

  int compared = 0;
  int64_t replay_ones = 0;
  for (const v1::RankCoords& rank : AllRanks(TopoB())) {
    absl::StatusOr<std::vector<v1::Microbatch>> s =
        FetchRankMicrobatches(single->address(), "rec2", rank, Delivery::kProxy);
    ASSERT_TRUE(s.ok()) << s.status();
    const std::vector<std::string> expected = Bytes(*s);
    for (size_t m = 0; m < 3; ++m) {
      absl::StatusOr<std::vector<v1::Microbatch>> c =
          FetchRankMicrobatches(Address(m), "rec2", rank, Delivery::kProxy);
      ASSERT_TRUE(c.ok()) << "member " << m << " rank " << rank.ShortDebugString() << ": "
                          << c.status();
      EXPECT_EQ(Bytes(*c), expected) << "member " << m << " rank " << rank.ShortDebugString();
    }
    absl::StatusOr<std::vector<v1::Microbatch>> direct =
        FetchRankMicrobatches(Address(0), "rec2", rank, Delivery::kDirect);
    ASSERT_TRUE(direct.ok()) << "rank " << rank.ShortDebugString() << ": " << direct.status();
    EXPECT_EQ(Bytes(*direct), expected) << "direct, rank " << rank.ShortDebugString();
    compared += static_cast<int>(expected.size());
    if (rank.pp() == 0) {
      for (const v1::Microbatch& mb : *direct) replay_ones += MaskOnes(mb);
    }
  }
  EXPECT_GT(compared, 0);
  // Every real token replayable, once per stage over the (cp, tp) ranks.
  EXPECT_EQ(replay_ones, committed->tokens());
}

// The id a conflicting copy of entry (row, layer 0) puts in place of its
// first id: valid, and not in the entry's set.
v1::NDArray Conflicting(const v1::Microbatch& mb, int64_t row, int num_experts) {
  v1::NDArray copy = mb.replay_experts();
  const int64_t layers = copy.shape(1), k = copy.shape(2);
  std::string& data = *copy.mutable_data();
  const int64_t at = row * layers * k;
  std::set<int> entry;
  for (int64_t j = 0; j < k; ++j) entry.insert(static_cast<uint8_t>(data[at + j]));
  for (int id = 0; id < num_experts; ++id) {
    if (!entry.count(id)) {
      data[at] = static_cast<char>(id);
      break;
    }
  }
  return copy;
}

TEST_F(ClusterRecomputeTest, APartialOrConflictingUploadChangesNothing) {
  StartThreeWithSamples();
  const std::vector<std::string> ids = InterleavedIds(6);
  const std::vector<v1::RankCoords> ranks = AllRanks(HybridTopology());
  ASSERT_TRUE(Client(0).CreateStep(StepRequest("p", ids, HybridTopology())).ok());
  // Only the micro-batches holding an m0 sample: m0's share is complete, so
  // an owner committing its part alone would show below.
  std::set<std::string> uncovered(ids.begin(), ids.end());
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StatusOr<std::vector<v1::Microbatch>> mbs =
        FetchRankMicrobatches(Address(1), "p", ranks[r], Delivery::kProxy);
    ASSERT_TRUE(mbs.ok()) << mbs.status();
    for (const v1::Microbatch& mb : *mbs) {
      const bool has_m0 = std::any_of(mb.sample_ids().begin(), mb.sample_ids().end(),
                                      [](const std::string& id) { return id.rfind("m0-", 0) == 0; });
      if (!has_m0) continue;
      for (const std::string& id : mb.sample_ids()) uncovered.erase(id);
      absl::StatusOr<v1::UploadRoutingResponse> up = Upload(Address(r % 3), ranks[r], mb);
      ASSERT_TRUE(up.ok()) << up.status();
    }
  }
  ASSERT_FALSE(uncovered.empty()) << "the plan packs every sample beside an m0 sample";
  absl::StatusOr<v1::CommitRoutingResponse> partial = Commit(Address(2), "p");
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kFailedPrecondition) << partial.status();
  EXPECT_THAT(std::string(partial.status().message()), HasSubstr("was not uploaded"));
  EXPECT_TRUE(NamesOneOf(partial.status(), uncovered)) << partial.status();
  ASSERT_TRUE(Client(1).ReleaseStep("p").ok());
  std::vector<std::string> m0_ids;
  for (const std::string& id : ids) {
    if (id.rfind("m0-", 0) == 0) m0_ids.push_back(id);
  }
  absl::StatusOr<v1::StepInfo> refused =
      Client(2).CreateStep(StepRequest("p2", m0_ids, HybridTopology(), v1::REPLAY_SOURCE_RECOMPUTE));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("holds no recompute routing"));
  if (refused.ok()) {
    ASSERT_TRUE(Client(2).ReleaseStep("p2").ok());  // so the rest still runs
  }

  // Everything uploaded, and one conflicting copy after the right one.
  ASSERT_TRUE(Client(2).CreateStep(StepRequest("q", ids, HybridTopology())).ok());
  std::vector<std::vector<v1::Microbatch>> q(ranks.size());
  bool conflicted = false;
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StatusOr<std::vector<v1::Microbatch>> mbs =
        FetchRankMicrobatches(Address(0), "q", ranks[r], Delivery::kDirect);
    ASSERT_TRUE(mbs.ok()) << mbs.status();
    q[r] = *std::move(mbs);
    for (const v1::Microbatch& mb : q[r]) {
      ASSERT_TRUE(Upload(Address(r % 3), ranks[r], mb).ok());
      const std::string& mask = mb.replay_mask().data();
      const size_t row = mask.find('\1');  // a real token: never dropped as padding
      if (conflicted || row == std::string::npos) continue;
      ASSERT_EQ(mb.replay_experts().dtype(), v1::UINT8);
      const v1::NDArray copy = Conflicting(mb, static_cast<int64_t>(row), 16);
      ASSERT_NE(copy.data(), mb.replay_experts().data());
      absl::StatusOr<v1::UploadRoutingResponse> bad = Upload(Address((r + 1) % 3), ranks[r], mb, &copy);
      EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition) << bad.status();
      EXPECT_THAT(std::string(bad.status().message()), HasSubstr("earlier upload placed"));
      conflicted = true;
    }
  }
  ASSERT_TRUE(conflicted);
  absl::StatusOr<v1::CommitRoutingResponse> committed = Commit(Address(1), "q");
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->samples(), static_cast<int>(ids.size()));
  ASSERT_TRUE(Client(0).ReleaseStep("q").ok());

  // Replayed in the same layout: every real row holds the set "q" sent.
  ASSERT_TRUE(
      Client(1).CreateStep(StepRequest("q2", ids, HybridTopology(), v1::REPLAY_SOURCE_RECOMPUTE)).ok());
  int64_t rows = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StatusOr<std::vector<v1::Microbatch>> mbs =
        FetchRankMicrobatches(Address(2), "q2", ranks[r], Delivery::kProxy);
    ASSERT_TRUE(mbs.ok()) << mbs.status();
    ASSERT_EQ(mbs->size(), q[r].size()) << "rank " << r;
    for (size_t i = 0; i < q[r].size(); ++i) {
      const v1::Microbatch &before = q[r][i], &after = (*mbs)[i];
      ASSERT_THAT(after.sample_ids(), ::testing::ElementsAreArray(before.sample_ids()));
      ASSERT_EQ(after.replay_experts().data().size(), before.replay_experts().data().size());
      const int64_t k = before.replay_experts().shape(2);
      const std::string &mask = after.replay_mask().data(), &was = before.replay_mask().data();
      for (size_t row = 0; row < mask.size(); ++row) {
        if (was[row] == '\1') {
          EXPECT_EQ(mask[row], '\1') << "rank " << r << " row " << row;
        }
        if (mask[row] != '\1') continue;
        ++rows;
        const int64_t layers = before.replay_experts().shape(1);
        for (int64_t l = 0; l < layers; ++l) {
          const size_t at = (row * layers + l) * k;
          std::string sent = before.replay_experts().data().substr(at, k);
          std::sort(sent.begin(), sent.end());
          EXPECT_EQ(after.replay_experts().data().substr(at, k), sent)
              << "rank " << r << " micro-batch " << i << " row " << row << " layer " << l;
        }
      }
    }
  }
  EXPECT_EQ(rows, 2 * committed->tokens()) << "every real token once per stage";
}

// A dense model has no routing to record: uploads and commits through any
// member are refused by name, and the members keep serving.
TEST_F(ClusterRecomputeTest, ADenseStepIsRefusedByName) {
  for (size_t i = 0; i < 2; ++i) StartMember(i);
  v1::ModelSpec dense;
  dense.set_name("dense");
  dense.set_num_layers(4);
  ASSERT_TRUE(Client(0).RegisterModel("dense", dense).ok());
  std::vector<std::string> ids;
  for (size_t m = 0; m < 2; ++m) {
    std::vector<v1::Sample> samples(3);
    for (size_t k = 0; k < samples.size(); ++k) {
      samples[k].set_sample_id(absl::StrCat("d", m, "-", k));
      ids.push_back(samples[k].sample_id());
      v1::NDArray* tokens = samples[k].mutable_tokens();
      tokens->set_dtype(v1::INT32);
      tokens->add_shape(40);
      tokens->set_data(std::string(40 * 4, '\1'));
    }
    ASSERT_TRUE(Client(m).PutSamples("dense", samples).ok());
  }
  v1::CreateStepRequest request = StepRequest("dense-step", ids, HybridTopology());
  request.set_pool("dense");
  ASSERT_TRUE(Client(0).CreateStep(request).ok());
  v1::Microbatch mb;
  mb.set_step_id("dense-step");
  mb.mutable_replay_experts()->set_dtype(v1::UINT8);
  for (int64_t d : {1, 1, 2}) mb.mutable_replay_experts()->add_shape(d);
  mb.mutable_replay_experts()->set_data(std::string(2, '\0'));
  for (size_t m = 0; m < 2; ++m) {
    absl::StatusOr<v1::UploadRoutingResponse> up = Upload(Address(m), AllRanks(HybridTopology())[0], mb);
    EXPECT_EQ(up.status().code(), absl::StatusCode::kFailedPrecondition) << up.status();
    EXPECT_THAT(std::string(up.status().message()), HasSubstr("dense model"));
    absl::StatusOr<v1::CommitRoutingResponse> commit = Commit(Address(m), "dense-step");
    EXPECT_EQ(commit.status().code(), absl::StatusCode::kFailedPrecondition) << commit.status();
    EXPECT_THAT(std::string(commit.status().message()), HasSubstr("dense model"));
  }
  for (size_t m = 0; m < 2; ++m) EXPECT_TRUE(Client(m).GetPool("dense").ok()) << "member " << m;
}

TEST_F(ClusterRecomputeTest, ADownOwnerIsNamed) {
  StartThreeWithSamples();
  ASSERT_TRUE(Client(0).CreateStep(StepRequest("d", InterleavedIds(2), HybridTopology())).ok());
  const std::vector<v1::RankCoords> ranks = AllRanks(HybridTopology());
  // Everything uploaded while every owner is up: what the commit then needs
  // is member 1 alone, not a missing row.
  std::optional<std::pair<v1::RankCoords, v1::Microbatch>> with_m1;
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StatusOr<std::vector<v1::Microbatch>> mbs =
        FetchRankMicrobatches(Address(0), "d", ranks[r], Delivery::kProxy);
    ASSERT_TRUE(mbs.ok()) << mbs.status();
    for (const v1::Microbatch& mb : *mbs) {
      ASSERT_TRUE(Upload(Address(r % 3), ranks[r], mb).ok());
      for (const std::string& id : mb.sample_ids()) {
        if (id.rfind("m1-", 0) == 0 && MaskOnes(mb) > 0) with_m1.emplace(ranks[r], mb);
      }
    }
  }
  ASSERT_TRUE(with_m1.has_value());

  const std::string down = Address(1);
  members_[1]->Kill(SIGKILL);
  // Refused connection at once; then the member no longer listed.
  for (int phase = 0; phase < 2; ++phase) {
    if (phase == 1) {
      ASSERT_TRUE(Eventually([&] { return MemberKeys().count(down) == 0; }, absl::Seconds(20)));
    }
    const absl::Time asked = absl::Now();
    absl::StatusOr<v1::UploadRoutingResponse> up =
        Upload(Address(0), with_m1->first, with_m1->second);
    EXPECT_EQ(up.status().code(), absl::StatusCode::kUnavailable) << "phase " << phase << ": " << up.status();
    EXPECT_THAT(std::string(up.status().message()), HasSubstr(down));
    absl::StatusOr<v1::CommitRoutingResponse> commit = Commit(Address(2), "d");
    EXPECT_EQ(commit.status().code(), absl::StatusCode::kUnavailable) << "phase " << phase << ": " << commit.status();
    EXPECT_THAT(std::string(commit.status().message()), HasSubstr(down));
    EXPECT_LT(absl::Now() - asked, absl::Seconds(10)) << "within seconds, never a hang";
  }
}

}  // namespace
}  // namespace rollpack
