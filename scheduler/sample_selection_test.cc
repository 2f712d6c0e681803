#include "scheduler/sample_selection.h"

#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Owns the strings the candidates view.
struct Pool {
  std::vector<std::string> ids, groups;
  std::vector<SampleCandidate> candidates;

  void Add(std::string id, int64_t tokens, int64_t version = 0, std::string group = "",
           int32_t size = 0) {
    ids.push_back(std::move(id));
    groups.push_back(std::move(group));
    candidates.push_back({{}, tokens, version, {}, size});
  }
  std::vector<SampleCandidate> Span() {
    for (size_t i = 0; i < candidates.size(); ++i) {
      candidates[i].sample_id = ids[i];
      candidates[i].group_id = groups[i];
    }
    return candidates;
  }
  std::vector<std::string> Chosen(const Selection& s) {
    std::vector<std::string> out;
    for (int32_t i : s.chosen) out.push_back(ids[i]);
    return out;
  }
};

TEST(SampleSelection, OldestByCountAndNewestVersionWithIngestTies) {
  Pool p;
  p.Add("a", 10, 3);
  p.Add("b", 10, 5);
  p.Add("c", 10, 5);
  p.Add("d", 10, 4);
  SelectionRequest r;
  r.num_samples = 2;
  auto s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("a", "b"));
  r.order = SelectionOrder::kNewestVersion;
  r.num_samples = 3;
  s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("b", "c", "d"));
}

TEST(SampleSelection, StaleSamplesAreNeverSelectedAndNamedInTheShortfall) {
  Pool p;
  p.Add("old", 10, 1);
  p.Add("new", 10, 9);
  SelectionRequest r;
  r.num_samples = 1;
  r.policy_version = 10;
  r.max_staleness = 2;  // versions below 8 are stale
  auto s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("new"));
  r.num_samples = 2;
  s = SelectSamples(p.Span(), r, "step \"x\"");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(),
              HasSubstr("has 1 free samples (1 more are stale: policy_version 10, max_staleness 2), "
                        "2 requested"));
  // Version 0 is "unknown": nothing is stale.
  r.policy_version = 0;
  EXPECT_TRUE(SelectSamples(p.Span(), r, "step").ok());
  // The bound is inclusive: version - bound is still fresh.
  SelectionRequest edge;
  edge.policy_version = 10;
  edge.max_staleness = 9;
  EXPECT_FALSE(IsStale(edge, 1));
  EXPECT_TRUE(IsStale(edge, 0));
  // Any version a producer sends is compared without overflow.
  EXPECT_TRUE(IsStale(edge, std::numeric_limits<int64_t>::min()));
  EXPECT_FALSE(IsStale(edge, std::numeric_limits<int64_t>::max()));
}

TEST(SampleSelection, GroupsAreTakenWholeInTheOrderTheyCompleted) {
  Pool p;
  p.Add("g1a", 5, 1, "g1", 2);
  p.Add("g2a", 5, 1, "g2", 2);
  p.Add("g2b", 5, 1, "g2", 2);  // g2 completes first
  p.Add("u", 5);                // ungrouped: never in a group selection
  p.Add("g1b", 5, 1, "g1", 2);
  p.Add("g3a", 5, 1, "g3", 3);  // incomplete
  SelectionRequest r;
  r.num_groups = 2;
  auto s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("g2a", "g2b", "g1a", "g1b"));
  EXPECT_EQ(s->num_groups, 2);
  EXPECT_EQ(s->num_tokens, 20);
  r.num_groups = 3;
  s = SelectSamples(p.Span(), r, "step");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("has 2 complete free groups, 3 requested"));
}

TEST(SampleSelection, NewestVersionOrdersGroupsByTheirLowestVersion) {
  Pool p;
  p.Add("a1", 1, 7, "a", 2);
  p.Add("a2", 1, 2, "a", 2);  // a's version is 2
  p.Add("b1", 1, 5, "b", 2);
  p.Add("b2", 1, 5, "b", 2);
  SelectionRequest r;
  r.num_groups = 1;
  r.order = SelectionOrder::kNewestVersion;
  auto s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("b1", "b2"));
}

TEST(SampleSelection, AGroupWithAStaleSampleOrDisagreeingSizesIsNotSelectable) {
  Pool p;
  p.Add("a1", 1, 1, "a", 2);  // stale
  p.Add("a2", 1, 9, "a", 2);
  p.Add("b1", 1, 9, "b", 2);
  p.Add("b2", 1, 9, "b", 3);  // disagrees (two cluster members)
  SelectionRequest r;
  r.num_groups = 1;
  r.policy_version = 9;
  r.max_staleness = 1;
  EXPECT_EQ(SelectSamples(p.Span(), r, "step").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SampleSelection, TokenBudgetStopsAtTheFirstItemThatWouldPassIt) {
  Pool p;
  p.Add("a", 40);
  p.Add("b", 50);
  p.Add("c", 5);  // smaller, later: not skipped to
  SelectionRequest r;
  r.num_tokens = 60;
  auto s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("a"));
  EXPECT_EQ(s->num_tokens, 40);
  // At least one item, even past the budget.
  r.num_tokens = 30;
  s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("a"));
  // Exactly the budget.
  r.num_tokens = 90;
  s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("a", "b"));
  r.num_tokens = 96;
  s = SelectSamples(p.Span(), r, "pool \"p\"");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(),
              HasSubstr("pool \"p\" has 95 tokens in 3 free samples, num_tokens 96 requested"));
}

TEST(SampleSelection, TokenBudgetOverWholeGroupsCountsAGroupAsItsTokens) {
  Pool p;
  p.Add("a1", 10, 0, "a", 2);
  p.Add("a2", 10, 0, "a", 2);
  p.Add("b1", 30, 0, "b", 2);
  p.Add("b2", 30, 0, "b", 2);
  SelectionRequest r;
  r.num_tokens = 79;
  r.whole_groups = true;
  auto s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("a1", "a2"));
  EXPECT_EQ(s->num_groups, 1);
}

TEST(SampleSelection, CountOverWholeGroupsMustBeReachedExactly) {
  Pool p;
  for (const char* g : {"a", "b"}) {
    for (int i = 0; i < 3; ++i) p.Add(std::string(g) + std::to_string(i), 1, 0, g, 3);
  }
  SelectionRequest r;
  r.num_samples = 6;
  r.whole_groups = true;
  auto s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->chosen.size(), 6u);
  EXPECT_EQ(s->num_groups, 2);
  r.num_samples = 4;
  s = SelectSamples(p.Span(), r, "step");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(),
              HasSubstr("whole groups in selection order reach 3 samples, not 4 (the next group "
                        "has 3)"));
}

TEST(SampleSelection, CountWithoutWholeGroupsIgnoresGroupsButCountsCompleteOnes) {
  Pool p;
  p.Add("a1", 1, 0, "a", 2);
  p.Add("a2", 1, 0, "a", 2);
  p.Add("b1", 1, 0, "b", 2);
  SelectionRequest r;
  r.num_samples = 3;
  auto s = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_groups, 1);
}

TEST(SampleSelection, RequestMustSetExactlyOneAmount) {
  Pool p;
  p.Add("a", 1);
  SelectionRequest r;
  EXPECT_EQ(SelectSamples(p.Span(), r, "step").status().code(),
            absl::StatusCode::kInvalidArgument);
  r.num_samples = 1;
  r.num_tokens = 1;
  EXPECT_EQ(SelectSamples(p.Span(), r, "step").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SampleSelection, ExplicitIdsNameAStaleSampleAndAGroupNotCoveredWhole) {
  Pool p;
  p.Add("a1", 1, 4, "a", 3);
  p.Add("a2", 1, 4, "a", 3);
  p.Add("old", 1, 1);
  SelectionRequest r;
  r.policy_version = 5;
  r.max_staleness = 2;
  std::vector<SampleCandidate> all = p.Span();
  auto checked = CheckExplicitSelection({all[2]}, r, "step \"s\"");
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(checked.status().message(),
              HasSubstr("sample \"old\" is stale: its policy_version 1 is older than 5 - "
                        "max_staleness 2"));
  r.whole_groups = true;
  checked = CheckExplicitSelection({all[0], all[1]}, r, "step \"s\"");
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(checked.status().message(),
              HasSubstr("group \"a\" is not covered whole: 1 of its 3 samples are missing"));
  r.whole_groups = false;
  checked = CheckExplicitSelection({all[0], all[1]}, r, "step \"s\"");
  ASSERT_TRUE(checked.ok());
  EXPECT_EQ(*checked, 0);
  // An ungrouped sample is whole by itself.
  r.whole_groups = true;
  r.policy_version = 0;
  checked = CheckExplicitSelection({all[2]}, r, "step \"s\"");
  EXPECT_TRUE(checked.ok()) << checked.status();
}

// A prefix of the oldest free samples decides an OLDEST selection exactly
// when the whole pool would choose the same; otherwise it asks for more.
TEST(SampleSelection, APrefixDecidesOnlyWhatTheWholePoolWouldChoose) {
  Pool p;
  for (int i = 0; i < 40; ++i) {
    const std::string g = "g" + std::to_string(i % 10);
    p.Add("s" + std::to_string(i), 1 + (i * 7) % 13, 0, g, 4);
  }
  const std::vector<SampleCandidate> all = p.Span();
  for (int64_t amount : {1, 2, 5, 9, 10}) {
    for (int kind = 0; kind < 4; ++kind) {
      SelectionRequest r;
      if (kind == 0) r.num_groups = amount;
      if (kind == 1 || kind == 2) r.num_tokens = amount * 20;
      if (kind == 3) r.num_samples = amount * 4;
      r.whole_groups = kind >= 2;
      auto whole = SelectSamples(all, r, "step");
      for (size_t n = 0; n <= all.size(); ++n) {
        auto part = SelectSamples(absl::MakeConstSpan(all).subspan(0, n), r, "step",
                                  /*prefix=*/n < all.size());
        ASSERT_TRUE(part.ok() || !whole.ok()) << part.status();
        if (!part.ok()) {
          EXPECT_EQ(part.status().code(), whole.status().code());
          continue;
        }
        if (part->needs_more) continue;
        ASSERT_TRUE(whole.ok()) << "kind " << kind << " amount " << amount << " prefix " << n;
        EXPECT_EQ(part->chosen, whole->chosen) << "kind " << kind << " prefix " << n;
      }
    }
  }
  SelectionRequest newest;
  newest.num_samples = 1;
  newest.order = SelectionOrder::kNewestVersion;
  EXPECT_EQ(SelectSamples(all, newest, "step", /*prefix=*/true).status().code(),
            absl::StatusCode::kInternal);
}

TEST(SampleSelection, AStepOverTheServersSampleLimitIsRefusedNotCut) {
  Pool p;
  for (int i = 0; i < 10; ++i) p.Add("s" + std::to_string(i), 5, 0, "g" + std::to_string(i / 2), 2);
  SelectionRequest r;
  r.max_samples = 4;
  // Exactly at the limit: taken.
  r.num_samples = 4;
  auto s = SelectSamples(p.Span(), r, "step \"s1\"");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->chosen.size(), 4u);
  // A count over it is refused before anything is selected.
  r.num_samples = 5;
  s = SelectSamples(p.Span(), r, "step \"s1\"");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.status().message(), HasSubstr("step \"s1\": the step would take 5 samples"));
  EXPECT_THAT(s.status().message(), HasSubstr("at most 4 per step (--max-samples-per-step)"));
  // Token budgets and whole groups are refused by what they would take.
  r.num_samples = 0;
  r.num_tokens = 25;
  s = SelectSamples(p.Span(), r, "step");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.status().message(), HasSubstr("would take 5 samples"));
  r.num_tokens = 0;
  r.num_groups = 3;
  s = SelectSamples(p.Span(), r, "step");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.status().message(), HasSubstr("would take 6 samples"));
  r.num_groups = 2;
  EXPECT_TRUE(SelectSamples(p.Span(), r, "step").ok());
  // Explicit ids alike.
  std::vector<SampleCandidate> all = p.Span();
  EXPECT_EQ(CheckExplicitSelection(absl::MakeSpan(all).subspan(0, 5), r, "step").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckExplicitSelection(absl::MakeSpan(all).subspan(0, 4), r, "step").ok());
  // 0 = no limit.
  r.max_samples = 0;
  r.num_groups = 5;
  EXPECT_TRUE(SelectSamples(p.Span(), r, "step").ok());
}

TEST(SampleSelection, SameInputsSameSelection) {
  Pool p;
  for (int i = 0; i < 200; ++i) {
    p.Add("s" + std::to_string(i), 1 + (i * 37) % 101, i % 7, "g" + std::to_string(i % 23), 0);
    p.candidates.back().group_size = (i % 23) == 0 ? 9 : 8 + (i % 23 == 0);
  }
  SelectionRequest r;
  r.num_tokens = 1000;
  r.whole_groups = true;
  r.order = SelectionOrder::kNewestVersion;
  auto a = SelectSamples(p.Span(), r, "step");
  auto b = SelectSamples(p.Span(), r, "step");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->chosen, b->chosen);
  EXPECT_GT(a->num_groups, 0);
}

// lifecycle.md section 6: a candidate missing a required scalar is never
// selected, its group is not complete, and a group an annotation completed
// sorts by its ready key (when its last member became selectable).
TEST(SampleSelection, RequiredScalarsGateSamplesAndOrderGroupsByTheirLastAnnotation) {
  Pool p;
  p.Add("g1", 10, 0, "g", 2);
  p.Add("g2", 10, 0, "g", 2);
  p.Add("h1", 10, 0, "h", 2);
  p.Add("h2", 10, 0, "h", 2);
  p.Add("x", 10);
  std::vector<SampleCandidate> c = p.Span();
  // g's last annotation came after h was sealed and annotated; x lacks one.
  const int64_t ready[] = {1, 9, 3, 4, 5};
  for (size_t i = 0; i < c.size(); ++i) c[i].ready_key = ready[i];
  c[4].missing_scalar = "reward";
  SelectionRequest r;
  r.num_groups = 1;
  auto s = SelectSamples(c, r, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("h1", "h2"));
  // A prefix of the candidates cannot decide that order.
  s = SelectSamples(c, r, "step", /*prefix=*/true);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->needs_more);
  // Single samples stay in ingest order; the unannotated one is skipped and
  // named in a shortfall; token budgets count selectable samples only.
  SelectionRequest count;
  count.num_samples = 5;
  s = SelectSamples(c, count, "step");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(),
              HasSubstr("has 4 free samples (1 more lack a required scalar"));
  SelectionRequest tokens;
  tokens.num_tokens = 50;
  s = SelectSamples(c, tokens, "step");
  EXPECT_THAT(s.status().message(), HasSubstr("has 40 tokens in 4 free samples"));
  count.num_samples = 4;
  s = SelectSamples(c, count, "step");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(p.Chosen(*s), ElementsAre("g1", "g2", "h1", "h2"));
  // A group with a member lacking a scalar is not complete.
  c[1].missing_scalar = "reward";
  r.num_groups = 2;
  s = SelectSamples(c, r, "step");
  EXPECT_THAT(s.status().message(), HasSubstr("has 1 complete free groups"));
  // An explicit id lacking one is named with the scalar.
  absl::StatusOr<int32_t> explicit_ids =
      CheckExplicitSelection({c[0], c[1]}, SelectionRequest{}, "step \"s\"");
  EXPECT_EQ(explicit_ids.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(explicit_ids.status().message(),
              HasSubstr("step \"s\": sample \"g2\" lacks scalar \"reward\""));
}

}  // namespace
}  // namespace rollpack
