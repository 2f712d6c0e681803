#include "scheduler/scheduler_kind.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

TEST(SchedulerKindTest, EveryKindHasOneRowAndTraitsOfFindsIt) {
  std::set<SchedulerKind> kinds;
  for (const SchedulerKindTraits& row : kSchedulerKinds) {
    EXPECT_TRUE(kinds.insert(row.kind).second) << row.name << " listed twice";
    EXPECT_EQ(&TraitsOf(row.kind), &row) << row.name;
  }
}

TEST(SchedulerKindTest, NamesAndAliasesRoundTripAndAreDistinct) {
  std::set<absl::string_view> spellings;
  for (const SchedulerKindTraits& row : kSchedulerKinds) {
    EXPECT_FALSE(row.name.empty());
    EXPECT_FALSE(row.alias.empty());
    EXPECT_FALSE(row.title.empty());
    EXPECT_TRUE(spellings.insert(row.name).second) << row.name;
    EXPECT_TRUE(spellings.insert(row.alias).second) << row.alias;
    EXPECT_EQ(SchedulerKindFromName(row.name), row.kind) << row.name;
    EXPECT_EQ(SchedulerKindFromName(row.alias), row.kind) << row.alias;
  }
}

TEST(SchedulerKindTest, RefusesOtherNames) {
  for (absl::string_view name : {"", "STATIC_CP", "Dynamic", "static CP", "dynamic_cp "}) {
    EXPECT_EQ(SchedulerKindFromName(name), std::nullopt) << "'" << name << "'";
  }
}

TEST(SchedulerKindTest, SpellingsKeepTheCliWording) {
  EXPECT_EQ(SchedulerKindNames(), "static_cp or dynamic_cp");
  EXPECT_EQ(SchedulerKindSpellings(), "static_cp (or static) or dynamic_cp (or dynamic)");
  EXPECT_EQ(TraitsOf(SchedulerKind::kStaticCp).name, "static_cp");
  EXPECT_EQ(TraitsOf(SchedulerKind::kDynamicCp).title, "dynamic CP");
}

}  // namespace
}  // namespace rollpack
