// DeviceStream's host path (device -1, what CI can run) against the raw
// TrainerStream messages of every rank, and the Rendezvous service. The
// CUDA path and TP-leader mode are tested on the GPU machine
// (client/python/tests/gpu_trainer.py, docs/trainer.md).
#include "client/trainer/device_stream.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "client/cpp/client.h"
#include "testing/synthetic_rollouts.h"
#include "client/cpp/trainer_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "testing/in_process_server.h"

namespace rollpack {
namespace {

class DeviceStreamTest : public InProcessServerTest {
 protected:
  void MakeStep(const std::string& step, int experts, int topk) {
    v1::ModelSpec model;
    model.set_name("m");
    model.set_num_layers(8);
    for (int l : {1, 2, 3, 5, 6, 7}) model.add_moe_layers(l);
    model.set_num_experts(experts);
    model.set_topk(topk);
    ASSERT_TRUE(client_->RegisterModel(step, model).ok());
    SyntheticOptions o;
    o.num_samples = 24;
    o.median_length = 300;
    o.max_length = 1500;
    o.seed = 11;
    std::vector<v1::Sample> samples = MakeSyntheticRollouts(model, o);
    ASSERT_TRUE(client_->PutSamples(step, samples).ok());
    v1::CreateStepRequest create;
    create.set_step_id(step);
    create.set_pool(step);
    create.set_num_samples(24);
    v1::Topology* t = create.mutable_topology();
    t->set_cp(2);
    t->set_tp(2);
    t->set_pp(2);
    t->set_max_tokens_per_rank(2048);
    absl::StatusOr<v1::StepInfo> info = client_->CreateStep(create);
    ASSERT_TRUE(info.ok()) << info.status();
  }

  static void ExpectSameBytes(const ArrayRef& got, const v1::NDArray& want, const char* what) {
    ASSERT_EQ(got.dtype, want.dtype()) << what;
    ASSERT_EQ(got.shape, std::vector<int64_t>(want.shape().begin(), want.shape().end())) << what;
    ASSERT_EQ(static_cast<size_t>(got.nbytes()), want.data().size()) << what;
    EXPECT_EQ(std::memcmp(got.data, want.data().data(), want.data().size()), 0) << what;
  }

  void CheckAllRanks(const std::string& step, bool ids_int32, bool fill) {
    for (int cp = 0; cp < 2; ++cp) {
      for (int tp = 0; tp < 2; ++tp) {
        for (int pp = 0; pp < 2; ++pp) {
          v1::RankCoords rank;
          rank.set_cp(cp);
          rank.set_tp(tp);
          rank.set_pp(pp);
          TrainerStream ref(channel_, step, rank);
          DeviceStreamOptions o;
          o.ids_int32 = ids_int32;
          o.masked_fill_minus_one = fill;
          o.prefetch = 1;
          absl::StatusOr<std::unique_ptr<DeviceStream>> ds = DeviceStream::Open(channel_, step, rank, o);
          ASSERT_TRUE(ds.ok()) << ds.status();
          int count = 0;
          while (true) {
            auto want = ref.Next();
            auto got = (*ds)->Next();
            ASSERT_TRUE(want.ok() && got.ok());
            ASSERT_EQ(want->has_value(), *got != nullptr);
            if (*got == nullptr) break;
            ++count;
            const v1::Microbatch& w = **want;
            const DeviceBatch& g = **got;
            EXPECT_EQ(g.device(), -1);
            EXPECT_EQ(g.meta().index(), w.index());
            EXPECT_THAT(g.meta().sample_ids(), ::testing::ElementsAreArray(w.sample_ids()));
            EXPECT_THAT(g.meta().replay_layers(), ::testing::ElementsAreArray(w.replay_layers()));
            ExpectSameBytes(g.tokens(), w.tokens(), "tokens");
            ExpectSameBytes(g.cu_seqlens(), w.cu_seqlens(), "cu_seqlens");
            ExpectSameBytes(g.cu_seqlens_padded(), w.cu_seqlens_padded(), "cu_seqlens_padded");
            ExpectSameBytes(g.replay_mask(), w.replay_mask(), "replay_mask");
            ExpectSameBytes(g.replay_experts(), w.replay_experts(), "replay_experts");
            ASSERT_EQ(g.token_fields().size(), static_cast<size_t>(w.token_fields_size()));
            for (const auto& [name, a] : w.token_fields()) {
              ExpectSameBytes(g.token_fields().at(name), a, name.c_str());
            }
            // Ids: [layers, rows, K] from [rows, layers, K], written here as a loop.
            const v1::NDArray& ex = w.replay_experts();
            ASSERT_EQ(ex.shape_size(), 3);
            const int64_t rows = ex.shape(0), layers = ex.shape(1), k = ex.shape(2);
            EXPECT_EQ(layers, 3);
            ASSERT_EQ(g.replay_ids().shape, (std::vector<int64_t>{layers, rows, k}));
            EXPECT_EQ(g.replay_ids().dtype, ids_int32 ? v1::INT32 : v1::INT64);
            const bool u16 = ex.dtype() == v1::UINT16;
            int64_t masked = 0;
            for (int64_t r = 0; r < rows; ++r) {
              const bool off = fill && w.replay_mask().data()[r] == 0;
              masked += off;
              for (int64_t l = 0; l < layers; ++l) {
                for (int64_t j = 0; j < k; ++j) {
                  const int64_t src = (r * layers + l) * k + j;
                  int64_t want_id;
                  if (u16) {
                    uint16_t v;
                    std::memcpy(&v, ex.data().data() + 2 * src, 2);
                    want_id = v;
                  } else {
                    want_id = static_cast<uint8_t>(ex.data()[src]);
                  }
                  if (off) want_id = -1;
                  const int64_t dst = (l * rows + r) * k + j;
                  const int64_t got_id =
                      ids_int32 ? static_cast<const int32_t*>(g.replay_ids().data)[dst]
                                : static_cast<const int64_t*>(g.replay_ids().data)[dst];
                  ASSERT_EQ(got_id, want_id) << "r=" << r << " l=" << l << " k=" << j;
                }
              }
            }
          }
          EXPECT_GT(count, 0);
        }
      }
    }
  }
};

TEST_F(DeviceStreamTest, HostPathEqualsTheWireForEveryRankU8) {
  MakeStep("u8", 64, 6);
  CheckAllRanks("u8", /*ids_int32=*/false, /*fill=*/false);
}

TEST_F(DeviceStreamTest, HostPathEqualsTheWireForEveryRankU16Int32Filled) {
  MakeStep("u16", 300, 8);
  CheckAllRanks("u16", /*ids_int32=*/true, /*fill=*/true);
}

TEST_F(DeviceStreamTest, Errors) {
  MakeStep("e", 64, 6);
  v1::RankCoords rank;
  DeviceStreamOptions o;
  o.tp_leader_size = 2;
  EXPECT_EQ(DeviceStream::Open(channel_, "e", rank, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  DeviceStreamOptions host;
  auto missing = DeviceStream::Open(channel_, "nope", rank, host);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ((*missing)->Next().status().code(), absl::StatusCode::kNotFound);
  DeviceStreamOptions gpu;
  gpu.device = 0;
  absl::StatusOr<std::unique_ptr<DeviceStream>> on_gpu = DeviceStream::Open(channel_, "e", rank, gpu);
  if (!DeviceStreamHasCuda()) {
    EXPECT_EQ(on_gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  } else if (!on_gpu.ok()) {  // built with CUDA, no device here
    EXPECT_EQ(on_gpu.status().code(), absl::StatusCode::kFailedPrecondition) << on_gpu.status();
  }
}

TEST_F(DeviceStreamTest, DestroyWhileReadingAhead) {
  MakeStep("d", 64, 6);
  v1::RankCoords rank;
  DeviceStreamOptions o;
  o.prefetch = 1;
  auto ds = DeviceStream::Open(channel_, "d", rank, o);
  ASSERT_TRUE(ds.ok());
  auto first = (*ds)->Next();
  ASSERT_TRUE(first.ok() && *first != nullptr);
  ds->reset();  // cancels the stream with micro-batches left
  EXPECT_GT((*first)->tokens().numel(), 0);  // the batch outlives its stream
}

TEST_F(DeviceStreamTest, RendezvousPostThenWaitAndWaitThenPost) {
  ASSERT_TRUE(RendezvousPost(channel_, "k1", std::string("\0id\xff", 4)).ok());
  absl::StatusOr<std::string> v = RendezvousWait(channel_, "k1", 5);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("\0id\xff", 4));

  absl::StatusOr<std::string> waited;
  std::thread waiter([&] { waited = RendezvousWait(channel_, "k2", 20); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(RendezvousPost(channel_, "k2", "late").ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(*waited, "late");

  // Replacing a value.
  ASSERT_TRUE(RendezvousPost(channel_, "k1", "new").ok());
  EXPECT_EQ(*RendezvousWait(channel_, "k1", 1), "new");
}

TEST_F(DeviceStreamTest, RendezvousDeadlineAndBadKey) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v = RendezvousWait(channel_, "never", 1);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(RendezvousPost(channel_, "", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RendezvousPost(channel_, std::string(600, 'k'), "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RendezvousPost(channel_, "big", std::string(70000, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
}

// With --auth-tokens, DeviceStreamOptions.auth_token goes out on the stream
// and the Rendezvous helpers send theirs (the TP-leader path uses both).
TEST(DeviceStreamAuthTest, TokenReachesStreamAndRendezvous) {
  const std::string path = ::testing::TempDir() + "/device-stream-tokens";
  std::ofstream(path) << "trainer trainer-token-0123456789\n";
  ServerOptions options;
  options.auth_tokens_file = path;
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::shared_ptr<grpc::Channel> channel = MakeChannel((*server)->address());
  auto first = [&](const std::string& token) {
    DeviceStreamOptions o;
    o.auth_token = token;
    absl::StatusOr<std::unique_ptr<DeviceStream>> ds =
        DeviceStream::Open(channel, "no-step", v1::RankCoords(), o);
    if (!ds.ok()) return ds.status();
    return (*ds)->Next().status();
  };
  EXPECT_EQ(first("").code(), absl::StatusCode::kUnauthenticated);
  const absl::Status with_token = first("trainer-token-0123456789");
  EXPECT_EQ(with_token.code(), absl::StatusCode::kNotFound) << with_token;  // names the step
  EXPECT_EQ(RendezvousPost(channel, "k", "v").code(), absl::StatusCode::kUnauthenticated);
  ASSERT_TRUE(RendezvousPost(channel, "k", "v", "trainer-token-0123456789").ok());
  EXPECT_EQ(RendezvousWait(channel, "k", 1).status().code(), absl::StatusCode::kUnauthenticated);
  absl::StatusOr<std::string> v = RendezvousWait(channel, "k", 1, "trainer-token-0123456789");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
  (*server)->Shutdown(absl::Seconds(1));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace rollpack
