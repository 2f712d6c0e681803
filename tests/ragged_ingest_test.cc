// Ragged per-token fields (docs/layout.md section 13) through a real
// rollpackd in durable mode: samples with a sampling_mask, whole and in
// pieces, counted in the pool's stored bytes, refused by name when
// malformed, and all back after kill -9 and a restart.
#include <signal.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "rollpack/v1/rollouts.grpc.pb.h"
#include "testing/durable_daemon_test.h"
#include "testing/ndarrays.h"

#ifndef ROLLPACKD_PATH
#error "ROLLPACKD_PATH must name the rollpackd binary"
#endif

namespace rollpack {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kTokens = 64;
constexpr int64_t kKept = 8;  // ids per generated token: the issue's ~32 bytes/token as int32

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("masked");
  m.set_num_layers(2);
  m.set_vocab_size(1000);
  return m;
}

// Tokens [begin, end) of rollout `id`: prompt tokens (< 16) keep nothing,
// the others kKept ids; with `mask` false, no sampling_mask at all.
v1::Sample Sample(const std::string& id, bool mask = true, int64_t begin = 0,
                  int64_t end = kTokens, int piece = -1, bool partial = false) {
  v1::Sample s;
  s.set_sample_id(id);
  if (piece >= 0) {
    s.set_piece(piece);
    s.set_partial(partial);
  }
  std::vector<int32_t> tokens, values;
  std::vector<int32_t> offsets = {0};
  for (int64_t t = begin; t < end; ++t) {
    tokens.push_back(static_cast<int32_t>(t + 1));
    for (int64_t j = 0; t >= 16 && j < kKept; ++j) {
      values.push_back(static_cast<int32_t>((t * 31 + j * 97) % 1000));
    }
    offsets.push_back(static_cast<int32_t>(values.size()));
  }
  *s.mutable_tokens() = TestArray(v1::INT32, tokens);
  if (mask) {
    v1::RaggedArray& field = (*s.mutable_ragged_token_fields())["sampling_mask"];
    *field.mutable_values() = TestArray(v1::INT32, values);
    *field.mutable_offsets() = TestArray(v1::INT32, offsets);
  }
  return s;
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return context;
}

class RaggedIngestTest : public DurableDaemonTest {
 protected:
  RaggedIngestTest() : DurableDaemonTest(ROLLPACKD_PATH) {}

  void Start() {
    ASSERT_NO_FATAL_FAILURE(StartDaemon());
    rollouts_ = v1::Rollouts::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Put(const std::string& pool, const std::vector<v1::Sample>& samples,
                   v1::PutSamplesResponse* response = nullptr) {
    v1::PutSamplesResponse unused;
    auto context = Context();
    auto writer = rollouts_->PutSamples(context.get(), response ? response : &unused);
    v1::PutSamplesRequest request;
    request.set_pool(pool);
    for (const v1::Sample& s : samples) *request.add_samples() = s;
    writer->Write(request);
    writer->WritesDone();
    return writer->Finish();
  }

  v1::PoolInfo Pool(const std::string& pool) {
    v1::GetPoolRequest request;
    request.set_pool(pool);
    v1::PoolInfo info;
    grpc::Status s = rollouts_->GetPool(Context().get(), request, &info);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return info;
  }

  // Stored bytes by sample id.
  std::map<std::string, int64_t> Listed(const std::string& pool) {
    v1::ListSamplesRequest request;
    request.set_pool(pool);
    v1::ListSamplesResponse response;
    grpc::Status s = rollouts_->ListSamples(Context().get(), request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::map<std::string, int64_t> out;
    for (const v1::SampleInfo& info : response.samples()) out[info.sample_id()] = info.stored_bytes();
    return out;
  }

  std::unique_ptr<v1::Rollouts::Stub> rollouts_;
};

TEST_F(RaggedIngestTest, SamplingMasksAreStoredCountedRefusedAndRecovered) {
  ASSERT_NO_FATAL_FAILURE(Start());
  for (const char* pool : {"masked", "plain"}) {
    v1::RegisterModelRequest request;
    request.set_pool(pool);
    *request.mutable_model() = Model();
    v1::RegisterModelResponse response;
    ASSERT_TRUE(rollouts_->RegisterModel(Context().get(), request, &response).ok());
  }
  std::vector<v1::Sample> masked, plain;
  for (int i = 0; i < 4; ++i) {
    masked.push_back(Sample("s" + std::to_string(i)));
    plain.push_back(Sample("s" + std::to_string(i), /*mask=*/false));
  }
  v1::PutSamplesResponse put;
  grpc::Status s = Put("masked", masked, &put);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(put.accepted(), 4);
  ASSERT_TRUE(Put("plain", plain).ok());
  // A sample in pieces: 40 tokens, then 24 more with their lists later.
  ASSERT_TRUE(Put("masked", {Sample("open", true, 0, 40, 0, true)}).ok());

  // Each masked sample holds its ids as uint16 (V = 1000) and 8 bytes per
  // offset more than the same sample without: 48 * 8 * 2 + 65 * 8 bytes.
  const int64_t lists = (kTokens - 16) * kKept * 2 + (kTokens + 1) * 8;
  const std::map<std::string, int64_t> with = Listed("masked");
  const std::map<std::string, int64_t> without = Listed("plain");
  for (int i = 0; i < 4; ++i) {
    const std::string id = "s" + std::to_string(i);
    EXPECT_GE(with.at(id) - without.at(id), lists) << id;
    EXPECT_LE(with.at(id) - without.at(id), lists + 256) << id;
  }
  const v1::PoolInfo before = Pool("masked");
  EXPECT_EQ(before.num_samples(), 4);
  EXPECT_EQ(before.num_open_samples(), 1);
  EXPECT_GE(before.stored_bytes() - Pool("plain").stored_bytes(), 4 * lists);

  // Refusals name the sample, the field, the token and the value.
  v1::Sample out_of_vocab = Sample("bad");
  const int32_t id = 1000;
  std::memcpy((*out_of_vocab.mutable_ragged_token_fields())["sampling_mask"]
                      .mutable_values()->mutable_data()->data() + 4 * 9,
              &id, 4);
  s = Put("masked", {out_of_vocab});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("sample \"bad\": ragged_token_fields[\"sampling_mask\"] has id 1000 at "
                        "token 17 (element 9), must be in [0, 1000) (ModelSpec.vocab_size)"));
  v1::Sample short_offsets = Sample("bad");
  (*short_offsets.mutable_ragged_token_fields())["sampling_mask"].mutable_offsets()->set_data(
      std::string(4 * kTokens, '\0'));
  (*short_offsets.mutable_ragged_token_fields())["sampling_mask"].mutable_offsets()->set_shape(
      0, kTokens);
  s = Put("masked", {short_offsets});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("offsets has 64 entries, must be n + 1 = 65"));
  s = Put("masked", {Sample("bad", /*mask=*/false)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("sample \"bad\": ragged_token_fields[\"sampling_mask\"] is missing"));
  s = Put("plain", {Sample("bad")});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("is not among the pool's ragged fields {}"));

  // kill -9 and a restart from the log: the same samples, bytes and names.
  daemon_->Kill(SIGKILL);
  ASSERT_NO_FATAL_FAILURE(Start());
  const v1::PoolInfo after = Pool("masked");
  EXPECT_EQ(after.num_samples(), 4);
  EXPECT_EQ(after.num_open_samples(), 1);
  EXPECT_EQ(after.stored_bytes(), before.stored_bytes());
  EXPECT_EQ(Listed("masked"), with);
  ASSERT_TRUE(Put("masked", masked, &put).ok());
  EXPECT_EQ(put.duplicates(), 4) << "identical re-sends, masks compared";
  masked[0].mutable_ragged_token_fields()->at("sampling_mask").mutable_values()->mutable_data()->at(0) ^= 1;
  EXPECT_EQ(Put("masked", {masked[0]}).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  s = Put("masked", {Sample("open", false, 40, kTokens, 1, false)});
  EXPECT_THAT(s.error_message(),
              HasSubstr("sample \"open\" piece 1: ragged_token_fields[\"sampling_mask\"] is missing"));
  s = Put("masked", {Sample("open", true, 40, kTokens, 1, false)});
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_GE(Listed("masked").at("open") - without.at("s0"), lists)
      << "sealed, it holds the lists of all its tokens";
}

}  // namespace
}  // namespace rollpack
