#include "server/cluster/member_health.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

using Kind = MemberHealth::Event::Kind;
using Ids = std::set<std::string>;

std::vector<std::string> Describe(const std::vector<MemberHealth::Event>& events) {
  std::vector<std::string> out;
  for (const MemberHealth::Event& e : events) {
    out.push_back((e.kind == Kind::kJoined ? "joined " : e.kind == Kind::kLeft ? "left " : "lost ") +
                  e.member);
  }
  return out;
}

TEST(MemberHealthTest, TheFirstListIsTakenAsItIsWithTheRostersOthersLost) {
  MemberHealth h;
  EXPECT_TRUE(h.NeedsRoster({"a"}));
  EXPECT_TRUE(h.Update({"a", "b"}, Ids{"a", "b", "c"}, false).empty());
  EXPECT_EQ(h.up(), (std::map<std::string, bool>{{"a", true}, {"b", true}, {"c", false}}));
  EXPECT_TRUE(h.HasLost());
}

TEST(MemberHealthTest, JoinedLeftAndLost) {
  MemberHealth h;
  h.Update({"a", "b", "c"}, Ids{"a", "b", "c"}, false);
  EXPECT_FALSE(h.NeedsRoster({"a", "b", "c"}));
  EXPECT_EQ(Describe(h.Update({"a", "b", "c", "d"}, std::nullopt, false)),
            std::vector<std::string>{"joined d"});
  // b stopped cleanly (its roster entry is gone), c was killed (its entry
  // outlives its key).
  const Ids listed = {"a", "d"};
  EXPECT_TRUE(h.NeedsRoster(listed));
  // Without the roster nothing missing is decided.
  EXPECT_TRUE(h.Update(listed, std::nullopt, false).empty());
  EXPECT_EQ(Describe(h.Update(listed, Ids{"a", "c", "d"}, false)),
            (std::vector<std::string>{"left b", "lost c"}));
  EXPECT_EQ(h.up(), (std::map<std::string, bool>{{"a", true}, {"c", false}, {"d", true}}));
  // Lost c is reported (down) until it joins again...
  EXPECT_EQ(Describe(h.Update({"a", "c", "d"}, std::nullopt, false)),
            std::vector<std::string>{"joined c"});
  EXPECT_EQ(h.up().at("c"), true);
  // ...or its roster entry runs out.
  EXPECT_EQ(Describe(h.Update({"a", "d"}, Ids{"a", "c", "d"}, false)),
            std::vector<std::string>{"lost c"});
  EXPECT_TRUE(h.Update({"a", "d"}, Ids{"a", "c", "d"}, false).empty());
  EXPECT_TRUE(h.Update({"a", "d"}, Ids{"a", "d"}, false).empty());
  EXPECT_EQ(h.up(), (std::map<std::string, bool>{{"a", true}, {"d", true}}));
  EXPECT_FALSE(h.HasLost());
}

TEST(MemberHealthTest, MembersMissingRightAfterEtcdTroubleAreWaitedFor) {
  // etcd revoked every lease when it went on: the list is short a moment.
  MemberHealth h;
  h.Update({"a", "b", "c"}, Ids{"a", "b", "c"}, false);
  EXPECT_TRUE(h.Update({"a"}, Ids{"a", "b", "c"}, /*rejoin_window=*/true).empty());
  EXPECT_EQ(h.up(), (std::map<std::string, bool>{{"a", true}, {"b", true}, {"c", true}}));
  EXPECT_TRUE(h.Update({"a", "b", "c"}, std::nullopt, false).empty());
  // One that does not come back is lost once the window is over.
  EXPECT_EQ(Describe(h.Update({"a", "b"}, Ids{"a", "b", "c"}, false)),
            std::vector<std::string>{"lost c"});
}

}  // namespace
}  // namespace rollpack
