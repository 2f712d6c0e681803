#include "scheduler/advantages.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::HasSubstr;

// A step's samples: owns the strings and values the AdvantageSamples view.
struct StepSamples {
  std::vector<std::string> ids;
  std::vector<std::string> groups;
  std::vector<int32_t> sizes;
  std::vector<double> values;
  std::vector<bool> has_value;

  void Add(std::string id, std::string group, int32_t size, double value, bool has = true) {
    ids.push_back(std::move(id));
    groups.push_back(std::move(group));
    sizes.push_back(size);
    values.push_back(value);
    has_value.push_back(has);
  }
  // A whole group of `rewards`.
  void AddGroup(const std::string& group, const std::vector<double>& rewards) {
    for (size_t i = 0; i < rewards.size(); ++i) {
      Add(absl::StrCat(group, "-", i), group, static_cast<int32_t>(rewards.size()), rewards[i]);
    }
  }
  std::vector<AdvantageSample> View() const {
    std::vector<AdvantageSample> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      out.push_back({ids[i], groups[i], sizes[i], has_value[i] ? &values[i] : nullptr});
    }
    return out;
  }
};

AdvantageRequest Estimator(AdvantageEstimator e, double eps = 0) {
  AdvantageRequest r;
  r.estimator = e;
  r.eps = eps;
  return r;
}

std::vector<float> Compute(const StepSamples& s, const AdvantageRequest& r) {
  absl::StatusOr<std::vector<float>> out = ComputeAdvantages(s.View(), r, "step \"s\"");
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<float>();
}

absl::Status Refusal(const StepSamples& s, const AdvantageRequest& r) {
  return ComputeAdvantages(s.View(), r, "step \"s\"").status();
}

// The textbook formulas, summed in plain order.
std::vector<double> Reference(const std::vector<double>& r, AdvantageEstimator e, double eps) {
  const double n = static_cast<double>(r.size());
  double sum = 0;
  for (double x : r) sum += x;
  const double mean = sum / n;
  double var = 0;
  for (double x : r) var += (x - mean) * (x - mean);
  const double std = std::sqrt(var / n);
  std::vector<double> out;
  for (double x : r) {
    switch (e) {
      case AdvantageEstimator::kGrpo: out.push_back((x - mean) / (std + eps)); break;
      case AdvantageEstimator::kGrpoMean: out.push_back(x - mean); break;
      case AdvantageEstimator::kRloo: out.push_back(x - (sum - x) / (n - 1)); break;
      default: out.push_back(0);
    }
  }
  return out;
}

TEST(AdvantagesTest, GrpoOfOneGroupMatchesNumpy) {
  StepSamples s;
  s.AddGroup("q", {1, 2, 3, 4});
  // numpy: (r - r.mean()) / (r.std() + 1e-6), as float32.
  EXPECT_THAT(Compute(s, Estimator(AdvantageEstimator::kGrpo)),
              ElementsAre(FloatEq(-1.3416396f), FloatEq(-0.4472132f), FloatEq(0.4472132f),
                          FloatEq(1.3416396f)));
  EXPECT_THAT(Compute(s, Estimator(AdvantageEstimator::kGrpo, 1.0)),
              ElementsAre(FloatEq(-0.7082039f), FloatEq(-0.23606798f), FloatEq(0.23606798f),
                          FloatEq(0.7082039f)));
}

TEST(AdvantagesTest, TiesShareTheirAdvantage) {
  StepSamples s;
  s.AddGroup("q", {0.5, 0.5, 1.0});
  EXPECT_THAT(Compute(s, Estimator(AdvantageEstimator::kGrpo)),
              ElementsAre(FloatEq(-0.7071038f), FloatEq(-0.7071038f), FloatEq(1.4142076f)));
}

TEST(AdvantagesTest, EqualRewardsGiveZeroNotNaN) {
  // std 0: 0 / (0 + eps) = 0, for every eps (and a group of one too).
  StepSamples s;
  s.AddGroup("same", {0.25, 0.25, 0.25, 0.25});
  s.AddGroup("one", {7});
  for (AdvantageEstimator e : {AdvantageEstimator::kGrpo, AdvantageEstimator::kGrpoMean}) {
    for (double eps : {0.0, 1e-12, 1.0}) {
      const std::vector<float> a = Compute(s, Estimator(e, eps));
      ASSERT_EQ(a.size(), 5u);
      for (float x : a) {
        EXPECT_EQ(x, 0.0f);
        EXPECT_FALSE(std::signbit(x) && x != 0);
      }
    }
  }
}

TEST(AdvantagesTest, GrpoMeanAndRloo) {
  StepSamples s;
  s.AddGroup("q", {1, 2, 3, 4});
  EXPECT_THAT(Compute(s, Estimator(AdvantageEstimator::kGrpoMean)),
              ElementsAre(FloatEq(-1.5f), FloatEq(-0.5f), FloatEq(0.5f), FloatEq(1.5f)));
  // r - mean of the others: 1 - 3, 2 - 8/3, 3 - 7/3, 4 - 2.
  EXPECT_THAT(Compute(s, Estimator(AdvantageEstimator::kRloo)),
              ElementsAre(FloatEq(-2.0f), FloatEq(static_cast<float>(2 - 8.0 / 3)),
                          FloatEq(static_cast<float>(3 - 7.0 / 3)), FloatEq(2.0f)));
  StepSamples pair;
  pair.AddGroup("p", {0, 1});
  EXPECT_THAT(Compute(pair, Estimator(AdvantageEstimator::kRloo)),
              ElementsAre(FloatEq(-1.0f), FloatEq(1.0f)));
}

TEST(AdvantagesTest, GroupsOfOneToSixtyFourInterleavedMatchTheFormulas) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> reward(-3, 5);
  StepSamples s;
  std::vector<std::vector<double>> rewards(64);
  for (int g = 0; g < 64; ++g) {
    for (int i = 0; i <= g; ++i) {
      // Every third reward a tie with the one before (verifiers give 0/1).
      rewards[g].push_back(i % 3 == 2 ? rewards[g].back() : reward(rng));
    }
  }
  // Interleaved: sample i of every group, then sample i + 1 of every group.
  std::vector<std::pair<int, int>> where;
  for (int i = 0; i < 64; ++i) {
    for (int g = i; g < 64; ++g) {
      s.Add(absl::StrCat("g", g, "-", i), absl::StrCat("g", g), g + 1, rewards[g][i]);
      where.emplace_back(g, i);
    }
  }
  for (AdvantageEstimator e : {AdvantageEstimator::kGrpo, AdvantageEstimator::kGrpoMean,
                               AdvantageEstimator::kRloo}) {
    StepSamples step = s;
    if (e == AdvantageEstimator::kRloo) {
      // Groups of at least 2: drop group 0 (one sample).
      step = StepSamples();
      for (size_t k = 0; k < s.ids.size(); ++k) {
        if (where[k].first > 0) step.Add(s.ids[k], s.groups[k], s.sizes[k], s.values[k]);
      }
    }
    const std::vector<float> got = Compute(step, Estimator(e));
    ASSERT_EQ(got.size(), step.ids.size());
    size_t k = 0;
    for (size_t j = 0; j < s.ids.size(); ++j) {
      const auto [g, i] = where[j];
      if (e == AdvantageEstimator::kRloo && g == 0) continue;
      const double want = Reference(rewards[g], e, AdvantageRequest::kDefaultEps)[i];
      EXPECT_NEAR(got[k], want, 1e-6 * std::max(1.0, std::fabs(want)))
          << AdvantageEstimatorName(e) << " group " << g << " sample " << i;
      ++k;
    }
  }
}

TEST(AdvantagesTest, SameBytesWhateverOrderTheGroupsSamplesSitIn) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> reward(0, 1);
  std::vector<double> r;
  for (int i = 0; i < 64; ++i) r.push_back(reward(rng) * std::pow(10.0, i % 7));
  StepSamples forward;
  forward.AddGroup("q", r);
  StepSamples backward;
  for (int i = 63; i >= 0; --i) backward.Add(forward.ids[i], "q", 64, r[i]);
  for (AdvantageEstimator e : {AdvantageEstimator::kGrpo, AdvantageEstimator::kGrpoMean,
                               AdvantageEstimator::kRloo}) {
    const std::vector<float> a = Compute(forward, Estimator(e));
    const std::vector<float> b = Compute(backward, Estimator(e));
    for (int i = 0; i < 64; ++i) {
      EXPECT_EQ(std::memcmp(&a[i], &b[63 - i], sizeof(float)), 0) << i;
    }
    // And the same on every call.
    EXPECT_EQ(std::memcmp(a.data(), Compute(forward, Estimator(e)).data(), 64 * sizeof(float)),
              0);
  }
}

TEST(AdvantagesTest, EpsMustBeFiniteAndNotNegative) {
  StepSamples s;
  s.AddGroup("q", {1, 2});
  for (double eps : {-1e-9, -1.0, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    absl::Status st = Refusal(s, Estimator(AdvantageEstimator::kGrpo, eps));
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_THAT(st.message(), HasSubstr("advantage_eps"));
  }
  AdvantageRequest unknown;
  unknown.estimator = static_cast<AdvantageEstimator>(9);
  EXPECT_THAT(Refusal(s, unknown).message(), HasSubstr("advantage 9 is not an AdvantageEstimator"));
  EXPECT_EQ(Estimator(AdvantageEstimator::kGrpo).effective_eps(), 1e-6);
  EXPECT_EQ(Estimator(AdvantageEstimator::kGrpo, 0.5).effective_eps(), 0.5);
}

TEST(AdvantagesTest, NoneComputesNothingAndRefusesNothing) {
  StepSamples s;
  s.Add("loose", "", 0, 0, /*has=*/false);
  absl::StatusOr<std::vector<float>> out =
      ComputeAdvantages(s.View(), AdvantageRequest(), "step \"s\"");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->empty());
}

TEST(AdvantagesTest, RefusalsNameTheGroupOrTheSample) {
  const AdvantageRequest grpo = Estimator(AdvantageEstimator::kGrpo);
  {
    StepSamples s;
    s.AddGroup("q", {1, 2});
    s.Add("loose", "", 0, 1);
    absl::Status st = Refusal(s, grpo);
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_THAT(st.message(), HasSubstr("step \"s\": sample \"loose\" is ungrouped"));
    // A group id without a size is no group either.
    StepSamples t;
    t.Add("half", "g", 0, 1);
    EXPECT_THAT(Refusal(t, grpo).message(), HasSubstr("sample \"half\" is ungrouped"));
  }
  {
    StepSamples s;
    s.Add("a", "g", 3, 1);
    s.Add("b", "g", 3, 2);
    absl::Status st = Refusal(s, Estimator(AdvantageEstimator::kGrpoMean));
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_THAT(st.message(), HasSubstr("group \"g\" has 2 of its 3 samples in the step; "
                                        "ADVANTAGE_GRPO_MEAN needs all of them"));
  }
  {
    StepSamples s;
    s.AddGroup("ok", {1, 2});
    s.AddGroup("single", {1});
    EXPECT_TRUE(Compute(s, grpo).size() == 3);
    absl::Status st = Refusal(s, Estimator(AdvantageEstimator::kRloo));
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_THAT(st.message(), HasSubstr("group \"single\" has 1 sample; ADVANTAGE_RLOO needs "
                                        "groups of at least 2"));
  }
  {
    StepSamples s;
    s.Add("a", "g", 2, 1);
    s.Add("b", "g", 2, 0, /*has=*/false);
    absl::Status st = Refusal(s, grpo);
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_THAT(st.message(), HasSubstr("sample \"b\" has no scalar \"reward\""));
    AdvantageRequest named = grpo;
    named.scalar = "score";
    EXPECT_THAT(Refusal(s, named).message(), HasSubstr("sample \"b\" has no scalar \"score\""));
  }
  {
    StepSamples s;
    s.Add("a", "g", 2, 1);
    s.Add("b", "g", 2, std::numeric_limits<double>::quiet_NaN());
    absl::Status st = Refusal(s, grpo);
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_THAT(st.message(), HasSubstr("sample \"b\" has scalar \"reward\" = nan"));
  }
  {
    StepSamples s;
    s.AddGroup("huge", {-1e300, 1e300});
    absl::Status st = Refusal(s, Estimator(AdvantageEstimator::kGrpoMean));
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_THAT(st.message(), HasSubstr("group \"huge\""));
    EXPECT_THAT(Refusal(s, grpo).message(), HasSubstr("group \"huge\": the standard deviation"));
    // Large but representable: GRPO normalises them.
    StepSamples big;
    big.AddGroup("big", {-1e150, 1e150});
    EXPECT_THAT(Compute(big, grpo), ElementsAre(FloatEq(-1.0f), FloatEq(1.0f)));
  }
  {
    // Group checks come before scalar checks, whatever the step order.
    StepSamples s;
    s.Add("nothing", "a", 1, 0, /*has=*/false);
    s.Add("b0", "b", 2, 1);
    EXPECT_THAT(Refusal(s, grpo).message(), HasSubstr("group \"b\" has 1 of its 2"));
    EXPECT_THAT(CheckAdvantageGroups(s.View(), grpo, "step \"s\"").message(),
                HasSubstr("group \"b\" has 1 of its 2"));
  }
}

}  // namespace
}  // namespace rollpack
