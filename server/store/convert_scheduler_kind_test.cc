// The scheduler kind on the wire: every value of rollpack.v1.SchedulerKind
// names a kind of scheduler/scheduler_kind.h and comes back as itself, so a
// wire value added without a kind (or a kind without its wire value) fails
// here, not in a step.
#include <iterator>

#include "gtest/gtest.h"
#include "server/store/convert.h"

namespace rollpack {
namespace {

TEST(ConvertSchedulerKind, EveryWireValueRoundTrips) {
  const google::protobuf::EnumDescriptor* wire = v1::SchedulerKind_descriptor();
  ASSERT_EQ(wire->value_count(), static_cast<int>(std::size(kSchedulerKinds)));
  for (int i = 0; i < wire->value_count(); ++i) {
    const auto value = static_cast<v1::SchedulerKind>(wire->value(i)->number());
    absl::StatusOr<SchedulerKind> kind = SchedulerKindFromProto(value);
    ASSERT_TRUE(kind.ok()) << wire->value(i)->name() << ": " << kind.status();
    EXPECT_EQ(ToProto(*kind), value) << wire->value(i)->name();
  }
}

TEST(ConvertSchedulerKind, EveryKindHasItsOwnWireValue) {
  for (const SchedulerKindTraits& row : kSchedulerKinds) {
    absl::StatusOr<SchedulerKind> back = SchedulerKindFromProto(ToProto(row.kind));
    ASSERT_TRUE(back.ok()) << row.name << ": " << back.status();
    EXPECT_EQ(*back, row.kind) << row.name;
  }
}

TEST(ConvertSchedulerKind, RefusesAnUnknownWireValueByNumber) {
  v1::Topology topology;
  topology.set_max_tokens_per_rank(1024);
  topology.set_scheduler(static_cast<v1::SchedulerKind>(7));
  const absl::StatusOr<Topology> t = NormalizeTopology(topology);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), "topology: unknown scheduler 7");
}

TEST(ConvertSchedulerKind, TopologyKeepsItsKind) {
  v1::Topology topology;
  topology.set_max_tokens_per_rank(1024);
  topology.set_scheduler(v1::DYNAMIC_CP);
  const absl::StatusOr<Topology> t = NormalizeTopology(topology);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->scheduler, SchedulerKind::kDynamicCp);
  EXPECT_EQ(ToProto(*t).scheduler(), v1::DYNAMIC_CP);
}

}  // namespace
}  // namespace rollpack
