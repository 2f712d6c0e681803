// ModelSpec's MTP fields (layout.md section 10) through the wire form, the
// durable log's RegisterModel record and a restart: a model without MTP
// layers encodes byte for byte as before they existed, and an MTP model
// with its [n, |M| + D, K] samples comes back unchanged.
#include "server/store/convert.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/log_records.h"
#include "testing/durable_store.h"

namespace rollpack {
namespace {

ModelSpec Model(int num_mtp_layers, bool mtp_routing) {
  ModelSpec m;
  m.name = "ds";
  m.num_layers = 4;
  m.moe_layers = {1, 2, 3};
  m.num_experts = 8;
  m.topk = 2;
  m.num_mtp_layers = num_mtp_layers;
  m.mtp_routing = mtp_routing;
  return m;
}

TEST(ConvertModelSpec, MtpFieldsRoundTrip) {
  for (const ModelSpec& m : {Model(0, false), Model(2, false), Model(1, true)}) {
    const v1::ModelSpec wire = ToProto(m);
    EXPECT_EQ(wire.num_mtp_layers(), m.num_mtp_layers);
    EXPECT_EQ(wire.mtp_routing(), m.mtp_routing);
    v1::ModelSpec parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
    EXPECT_EQ(FromProto(parsed), m);
  }
}

TEST(ConvertModelSpec, WithoutMtpTheBytesAreThoseOfBefore) {
  // What ToProto wrote before the MTP fields existed.
  v1::ModelSpec before;
  before.set_name("ds");
  before.set_num_layers(4);
  for (int l : {1, 2, 3}) before.add_moe_layers(l);
  before.set_num_experts(8);
  before.set_topk(2);
  EXPECT_EQ(ToProto(Model(0, false)).SerializeAsString(), before.SerializeAsString());
  // An old RegisterModel record decodes with D = 0.
  v1::RegisterModelRequest old_record;
  old_record.set_pool("p");
  *old_record.mutable_model() = before;
  EXPECT_EQ(EncodeRegisterModel("p", Model(0, false), PoolOptions{}),
            old_record.SerializeAsString());
  v1::RegisterModelRequest decoded;
  ASSERT_TRUE(decoded.ParseFromString(old_record.SerializeAsString()));
  const ModelSpec m = FromProto(decoded.model());
  EXPECT_EQ(m.num_mtp_layers, 0);
  EXPECT_FALSE(m.mtp_routing);
  EXPECT_EQ(m, Model(0, false));
}

TEST(ConvertModelSpec, MtpPoolSurvivesARestart) {
  TempDir dir;
  const ModelSpec model = Model(2, true);
  // One sample: n = 3 tokens, rows [3, |M| + D = 5, K = 2], the last missing.
  StoredSample s;
  s.sample_id = "s0";
  s.tokens = {7, 8, 9};
  for (int r = 0; r < 3; ++r)
    for (int l = 0; l < 5; ++l)
      for (int j = 0; j < 2; ++j) s.experts.push_back(r == 2 ? '\0' : static_cast<char>((l + 3 * j + r) % 8));
  s.row_valid = {1, 1, 0};
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(d->store->RegisterModel("p", model).ok());
    absl::StatusOr<PutResult> put = d->store->Put("p", {s});
    ASSERT_TRUE(put.ok()) << put.status();
  }
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<ModelSpec> recovered = d->store->GetModel("p");
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(*recovered, model);
  // The same spec again is a no-op; one without mtp_routing is another model.
  EXPECT_FALSE(*d->store->RegisterModel("p", model));
  EXPECT_EQ(d->store->RegisterModel("p", Model(2, false)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  Topology t;
  t.max_tokens_per_rank = 64;
  absl::StatusOr<std::shared_ptr<const Step>> step = d->store->CreateStep("st", "p", {"s0"}, 0, t);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ((*step)->samples.at(0)->experts, s.experts);
  EXPECT_EQ((*step)->layout.pipeline().stored_layers(), 5);
  EXPECT_THAT((*step)->layout.pipeline().stage(0).replay_layers,
              ::testing::ElementsAre(1, 2, 3, 4, 5));
}

}  // namespace
}  // namespace rollpack
