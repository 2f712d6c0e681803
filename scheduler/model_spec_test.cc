#include "scheduler/model_spec.h"

#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelSpec DeepSeekLike() {
  ModelSpec m;
  m.name = "ds";
  m.num_layers = 8;
  m.moe_layers = {2, 3, 4, 5, 6, 7};
  m.num_experts = 64;
  m.topk = 4;
  return m;
}

void ExpectRefused(const ModelSpec& m, std::initializer_list<const char*> parts) {
  absl::Status s = ValidateModelSpec(m);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const char* part : parts) EXPECT_THAT(std::string(s.message()), HasSubstr(part));
}

TEST(ModelSpecMtp, ValidSpecs) {
  ModelSpec m = DeepSeekLike();
  m.num_mtp_layers = 1;
  EXPECT_TRUE(ValidateModelSpec(m).ok());  // MTP routers live: no routing sent
  m.mtp_routing = true;
  EXPECT_TRUE(ValidateModelSpec(m).ok());
  m.num_mtp_layers = kMaxMtpLayers;
  EXPECT_TRUE(ValidateModelSpec(m).ok());

  ModelSpec dense;
  dense.name = "dense";
  dense.num_layers = 4;
  dense.num_mtp_layers = 2;  // a dense model may have MTP layers, without routing
  EXPECT_TRUE(ValidateModelSpec(dense).ok());
}

TEST(ModelSpecMtp, RefusalsNameFieldAndValue) {
  ModelSpec m = DeepSeekLike();
  m.num_mtp_layers = -1;
  ExpectRefused(m, {"model \"ds\"", "num_mtp_layers is -1", "[0, 64]"});
  m.num_mtp_layers = kMaxMtpLayers + 1;
  ExpectRefused(m, {"num_mtp_layers is 65"});
  m.num_mtp_layers = 0;
  m.mtp_routing = true;
  ExpectRefused(m, {"mtp_routing is set but num_mtp_layers is 0"});

  ModelSpec dense;
  dense.name = "dense";
  dense.num_layers = 4;
  dense.num_mtp_layers = 1;
  dense.mtp_routing = true;
  ExpectRefused(dense, {"mtp_routing is set but num_experts is 0"});

  // Layer counts are bounded (a forged cluster record of 700 million layers
  // exhausted memory), which also keeps num_layers + num_mtp_layers in int.
  ModelSpec huge = DeepSeekLike();
  huge.moe_layers.clear();
  huge.num_layers = std::numeric_limits<int>::max();
  huge.num_mtp_layers = 1;
  ExpectRefused(huge, {"num_layers is 2147483647", "[1, 4096]"});
  huge.num_layers = kMaxLayers + 1;
  ExpectRefused(huge, {"num_layers is 4097"});
  huge.num_layers = kMaxLayers;
  huge.num_mtp_layers = kMaxMtpLayers;
  EXPECT_TRUE(ValidateModelSpec(huge).ok());
}

TEST(ModelSpecMtp, EqualityCoversMtpFields) {
  ModelSpec a = DeepSeekLike(), b = DeepSeekLike();
  EXPECT_EQ(a, b);
  b.num_mtp_layers = 1;
  EXPECT_NE(a, b);
  a.num_mtp_layers = 1;
  EXPECT_EQ(a, b);
  b.mtp_routing = true;
  EXPECT_NE(a, b);
}

TEST(ModelSpecMtp, StoredLayers) {
  ModelSpec m = DeepSeekLike();
  m.num_mtp_layers = 2;
  EXPECT_EQ(m.num_moe_layers(), 6);
  EXPECT_EQ(m.routed_mtp_layers(), 0);
  EXPECT_EQ(m.stored_layers(), 6);
  EXPECT_THAT(m.StoredLayerIds(), ElementsAre(2, 3, 4, 5, 6, 7));
  m.mtp_routing = true;
  EXPECT_EQ(m.routed_mtp_layers(), 2);
  EXPECT_EQ(m.stored_layers(), 8);
  EXPECT_THAT(m.StoredLayerIds(), ElementsAre(2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_EQ(m.StoredLayerName(0), "MoE layer 2");
  EXPECT_EQ(m.StoredLayerName(5), "MoE layer 7");
  EXPECT_EQ(m.StoredLayerName(6), "MTP layer 0 (layer 8)");
  EXPECT_EQ(m.StoredLayerName(7), "MTP layer 1 (layer 9)");

  ModelSpec all = DeepSeekLike();
  all.moe_layers.clear();  // every layer MoE
  all.num_mtp_layers = 1;
  all.mtp_routing = true;
  EXPECT_EQ(all.stored_layers(), 9);
  EXPECT_EQ(all.StoredLayerName(3), "MoE layer 3");
  EXPECT_EQ(all.StoredLayerName(8), "MTP layer 0 (layer 8)");

  ModelSpec dense;
  dense.num_layers = 4;
  EXPECT_EQ(dense.stored_layers(), 0);
  EXPECT_TRUE(dense.StoredLayerIds().empty());
}

}  // namespace
}  // namespace rollpack
