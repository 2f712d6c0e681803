// Ragged per-token fields (docs/layout.md section 13) in a cluster of real
// processes: the first sample anywhere fixes the pool's ragged names for
// every member (through etcd's schema record), and a member serves its
// samples' lists to the others (Member.ReadSamples, as a planner or a
// member serving a step pulls them) exactly as it stores them.
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "rollpack/v1/member.grpc.pb.h"
#include "server/store/log_records.h"
#include "testing/cluster_fixture.h"
#include "testing/ndarrays.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("masked");
  m.set_num_layers(2);
  m.set_vocab_size(50000);
  return m;
}

// 12 tokens; token t keeps t % 3 ids (with `mask`).
v1::Sample Sample(const std::string& id, bool mask = true) {
  v1::Sample s;
  s.set_sample_id(id);
  std::vector<int32_t> tokens, values;
  std::vector<int64_t> offsets = {0};
  for (int t = 0; t < 12; ++t) {
    tokens.push_back(t + 1);
    for (int j = 0; j < t % 3; ++j) values.push_back(49000 + t * 7 + j);
    offsets.push_back(static_cast<int64_t>(values.size()));
  }
  *s.mutable_tokens() = TestArray(v1::INT32, tokens);
  if (mask) {
    v1::RaggedArray& field = (*s.mutable_ragged_token_fields())["sampling_mask"];
    *field.mutable_values() = TestArray(v1::INT32, values);
    *field.mutable_offsets() = TestArray(v1::INT64, offsets);
  }
  return s;
}

using ClusterRaggedIngestTest = ClusterFixture;

TEST_F(ClusterRaggedIngestTest, NamesHoldClusterWideAndListsTravelBetweenMembers) {
  StartMember(0);
  StartMember(1);
  ASSERT_TRUE(Client(0).RegisterModel("pool", Model()).ok());
  ASSERT_TRUE(Client(0).PutSamples("pool", {Sample("a0"), Sample("a1")}).ok());
  // Member 1's first batch of the pool finds the names member 0 fixed.
  absl::StatusOr<v1::PutSamplesResponse> refused =
      Client(1).PutSamples("pool", {Sample("b0", /*mask=*/false)});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("sample \"b0\": ragged_token_fields[\"sampling_mask\"] is missing"));
  ASSERT_TRUE(Client(1).PutSamples("pool", {Sample("b0"), Sample("b1")}).ok());
  // The record in etcd names them beside the (empty) dense fields.
  absl::StatusOr<std::optional<std::string>> schema =
      etcd_client_->Get(absl::StrCat("/", name_, "/schemas/pool"));
  ASSERT_TRUE(schema.ok() && schema->has_value());
  v1::Sample record;
  ASSERT_TRUE(record.ParseFromString(**schema));
  EXPECT_EQ(record.ragged_token_fields().count("sampling_mask"), 1u);
  EXPECT_EQ(record.token_fields_size(), 0);

  // A pool that declared its dense fields fixes its ragged names the same way.
  v1::RegisterModelRequest declared;
  declared.set_pool("declared");
  *declared.mutable_model() = Model();
  v1::TokenFieldSchema* loss_mask = declared.mutable_options()->add_token_fields();
  loss_mask->set_name("loss_mask");
  loss_mask->set_dtype(v1::UINT8);
  ASSERT_TRUE(Client(0).RegisterModel(declared).ok());
  auto with_loss_mask = [](v1::Sample s) {
    (*s.mutable_token_fields())["loss_mask"] = TestArray(v1::UINT8, std::vector<uint8_t>(12, 1));
    return s;
  };
  ASSERT_TRUE(Client(0).PutSamples("declared", {with_loss_mask(Sample("d0"))}).ok());
  refused = Client(1).PutSamples("declared", {with_loss_mask(Sample("d1", /*mask=*/false))});
  EXPECT_THAT(refused.status().message(),
              HasSubstr("sample \"d1\": ragged_token_fields[\"sampling_mask\"] is missing"));
  ASSERT_TRUE(Client(1).PutSamples("declared", {with_loss_mask(Sample("d1"))}).ok());

  // A step over both members holds b0 and b1 on member 1; member 1 serves
  // them to the others in the form that carries their lists.
  v1::CreateStepRequest step;
  step.set_step_id("step");
  step.set_pool("pool");
  for (const char* id : {"a0", "a1", "b0", "b1"}) step.add_sample_ids(id);
  step.mutable_topology()->set_max_tokens_per_rank(64);
  absl::StatusOr<v1::StepInfo> info = Client(0).CreateStep(step);
  ASSERT_TRUE(info.ok()) << info.status();
  auto member = v1::Member::NewStub(MakeChannel(members_[1]->address()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::ReadSamplesRequest read;
  read.set_step_id("step");
  read.add_sample_ids("b0");
  read.add_sample_ids("b1");
  auto reader = member->ReadSamples(&context, read);
  std::vector<StoredSample> got;
  v1::SampleBatch batch;
  while (reader->Read(&batch)) {
    EXPECT_EQ(batch.record_type(), static_cast<uint32_t>(RecordType::kRaggedSamples));
    std::string pool;
    ASSERT_TRUE(DecodeSamples(batch.encoded(), &pool, &got, RecordType::kRaggedSamples).ok());
  }
  grpc::Status finished = reader->Finish();
  ASSERT_TRUE(finished.ok()) << finished.error_message();
  ASSERT_EQ(got.size(), 2u);
  for (const StoredSample& s : got) {
    const StoredRagged& mask = s.ragged_fields.at("sampling_mask");
    EXPECT_EQ(mask.dtype, v1::UINT16) << "V = 50000 <= 65536";
    ASSERT_EQ(mask.offsets.size(), 13u);
    EXPECT_EQ(mask.offsets.back(), 12) << "0 + 1 + 2 per 3 tokens";
    uint16_t first;
    std::memcpy(&first, mask.values.data(), 2);
    EXPECT_EQ(first, 49000 + 1 * 7) << "token 1's one id";
  }
}

}  // namespace
}  // namespace rollpack
