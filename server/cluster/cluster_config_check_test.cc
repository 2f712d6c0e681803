#include "server/cluster/cluster_config_check.h"

#include "server/cluster/member_count_watch.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

TEST(CheckAdvertisable, RefusesAWildcardListenWithoutAdvertise) {
  for (const char* listen : {"0.0.0.0:50051", "[::]:50051", ":50051"}) {
    const absl::Status s = CheckAdvertisable(listen, "");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << listen;
    EXPECT_THAT(s.message(), HasSubstr("--cluster-advertise")) << listen;
    EXPECT_THAT(s.message(), HasSubstr("127.0.0.1")) << listen;
  }
  EXPECT_TRUE(CheckAdvertisable("0.0.0.0:50051", "10.0.0.7:50051").ok());
  EXPECT_TRUE(CheckAdvertisable("10.0.0.7:50051", "").ok());
  EXPECT_TRUE(CheckAdvertisable("127.0.0.1:0", "").ok());
}

TEST(CheckAdvertisable, RefusesAWildcardAdvertise) {
  for (const char* advertise : {"0.0.0.0:50051", "[::]:50051"}) {
    const absl::Status s = CheckAdvertisable("10.0.0.7:50051", advertise);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << advertise;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("--cluster-advertise \"", advertise)));
  }
}

TEST(LoopbackAdvertiseWarning, OnlyWhenEtcdIsElsewhere) {
  EXPECT_FALSE(LoopbackAdvertiseWarning("127.0.0.1:50051", "", {"http://127.0.0.1:2379"}));
  EXPECT_FALSE(LoopbackAdvertiseWarning("127.0.0.1:50051", "", {"localhost:2379"}));
  EXPECT_FALSE(LoopbackAdvertiseWarning("10.0.0.7:50051", "", {"http://etcd-0:2379"}));
  EXPECT_FALSE(
      LoopbackAdvertiseWarning("127.0.0.1:50051", "10.0.0.7:50051", {"http://etcd-0:2379"}));
  const std::optional<std::string> w =
      LoopbackAdvertiseWarning("127.0.0.1:50051", "", {"https://etcd-0.etcd:2379"});
  ASSERT_TRUE(w.has_value());
  EXPECT_THAT(*w, HasSubstr("advertises 127.0.0.1:50051 (--listen)"));
  EXPECT_THAT(*w, HasSubstr("https://etcd-0.etcd:2379"));
}

TEST(MembersByCluster, CountsEachClustersMembersButSelf) {
  const std::vector<std::string> keys = {
      "/rollpack/members/10.0.0.1:50051",
      "/rollpack/roster/10.0.0.1:50051",
      "/rollpack/members/10.0.0.2:50051",
      "/rollpack/steps/s1",
      "/rolpack/members/10.0.0.9:50051",
      "/rolpack/roster/10.0.0.9:50051",
      "/other/members/a:1",
      "/not-a-member-key",
  };
  const std::map<std::string, int> counts = MembersByCluster(keys, "rolpack", "10.0.0.9:50051");
  EXPECT_EQ(counts, (std::map<std::string, int>{{"other", 1}, {"rollpack", 2}}));
}

TEST(MisnamedClusterWarning, NamesTheOtherClustersWhenThisOneIsAlone) {
  const std::optional<std::string> w =
      MisnamedClusterWarning({{"rollpack", 3}, {"other", 1}}, "rolpack");
  ASSERT_TRUE(w.has_value());
  EXPECT_THAT(*w, HasSubstr("cluster \"rolpack\" has no other member; etcd holds members of "
                            "\"other\" (1), \"rollpack\" (3): is --cluster-name right?"));
  // Not alone, or nobody else there (the first member of the only cluster).
  EXPECT_FALSE(MisnamedClusterWarning({{"rolpack", 1}, {"rollpack", 3}}, "rolpack"));
  EXPECT_FALSE(MisnamedClusterWarning({}, "rolpack"));
}

TEST(MemberCountWarning, WhileFewerThanExpected) {
  EXPECT_FALSE(MemberCountWarning(3, 3, "rollpack"));
  EXPECT_FALSE(MemberCountWarning(4, 3, "rollpack"));
  const std::optional<std::string> w = MemberCountWarning(1, 3, "rollpack");
  ASSERT_TRUE(w.has_value());
  EXPECT_THAT(*w, HasSubstr("cluster \"rollpack\" has 1 live member of the 3 "
                            "--cluster-expect-members asks for"));
}

}  // namespace
}  // namespace rollpack
