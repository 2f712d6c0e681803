// kill -9 under load, many times: rollpackd in durable mode is killed while
// producers push samples and a controller creates, fetches and releases
// steps; after each restart everything acknowledged is back (samples with
// their content, live steps re-serving identical bytes, released steps
// gone). Counts acknowledged vs recovered.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/cpp/client.h"
#include "testing/reference_layout.h"
#include "testing/synthetic_rollouts.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "proto/wire/deterministic_bytes.h"
#include "server/store/durable_log.h"
#include "server/store/crc32c.h"
#include "testing/daemon_process.h"

#ifndef ROLLPACKD_PATH
#error "ROLLPACKD_PATH must name the rollpackd binary"
#endif

namespace rollpack {
namespace {

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("crash-model");
  m.set_num_layers(4);
  m.set_num_experts(300);
  m.set_topk(2);
  return m;
}

v1::Topology StepTopology(int dp) {
  v1::Topology t;
  t.set_dp(dp);
  t.set_max_tokens_per_rank(1024);
  return t;
}

// Every micro-batch of every dp rank, in order; empty on error.
absl::StatusOr<std::vector<v1::Microbatch>> FetchRank(const std::shared_ptr<grpc::Channel>& channel,
                                                      const std::string& step_id, int dp) {
  auto stub = v1::Trainer::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::FetchRequest request;
  request.set_step_id(step_id);
  request.mutable_rank()->set_dp(dp);
  request.set_all_fields(true);
  auto reader = stub->FetchMicrobatches(&context, request);
  std::vector<v1::Microbatch> out;
  v1::Microbatch mb;
  while (reader->Read(&mb)) out.push_back(mb);
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  return out;
}

absl::StatusOr<uint32_t> StepDigest(const std::shared_ptr<grpc::Channel>& channel,
                                    const std::string& step_id, int dp) {
  uint32_t crc = 0;
  for (int d = 0; d < dp; ++d) {
    absl::StatusOr<std::vector<v1::Microbatch>> mbs = FetchRank(channel, step_id, d);
    if (!mbs.ok()) return mbs.status();
    for (const v1::Microbatch& mb : *mbs) crc = Crc32c(DeterministicBytes(mb), crc);
  }
  return crc;
}

struct LiveStep {
  std::vector<std::string> ids;
  bool has_digest = false;
  uint32_t digest = 0;
};

// What the clients know was acknowledged, and what was in flight at a kill.
struct Ledger {
  absl::Mutex mu;
  std::map<std::string, v1::Sample> sent;
  std::set<std::string> free_acked;
  std::set<std::string> maybe_samples;
  std::map<std::string, LiveStep> live;
  std::set<std::string> released;
  // Step ids whose create (with these ids) or release was cut by the kill.
  std::map<std::string, std::vector<std::string>> maybe_created;
  std::set<std::string> maybe_released;
  int64_t acked_samples = 0;
  int64_t acked_steps = 0;
  int64_t acked_releases = 0;
  // Acknowledged samples that went into an acknowledged step.
  int64_t in_step_samples = 0;
};

TEST(CrashRecoveryTest, KillDashNineUnderLoadLosesNothingAcknowledged) {
  char tmpl[] = "/tmp/rollpack_crash_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{dir};
  const int iterations = std::getenv("ROLLPACK_CRASH_ITERATIONS")
                             ? std::atoi(std::getenv("ROLLPACK_CRASH_ITERATIONS"))
                             : 20;
  const char* policies[] = {"always", "batch", "never"};
  std::mt19937_64 rng(12345);
  Ledger ledger;
  int64_t recovered_samples = 0, recovered_steps = 0, identical_reserves = 0,
          resolved_in_flight = 0, verified_released = 0;
  ClientOptions client_options;
  client_options.deadline = absl::Seconds(20);

  for (int iter = 0; iter <= iterations; ++iter) {
    absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon = DaemonProcess::Start(
        ROLLPACKD_PATH,
        {"--data-dir=" + dir, std::string("--fsync=") + policies[iter % 3],
         "--compact-min-dead-bytes=200000", "--max-memory=2000000000"},
        dir + "/port");
    ASSERT_TRUE(daemon.ok()) << "iteration " << iter << ": " << daemon.status();
    auto channel = MakeChannel((*daemon)->address(), client_options);
    RollpackClient client(channel, client_options);
    ASSERT_TRUE(client.RegisterModel("p", Model()).ok());

    // ---- Verify the recovered state against the ledger.
    {
      absl::MutexLock lock(&ledger.mu);
      for (const auto& [step_id, ids] : ledger.maybe_created) {
        if (client.GetPlan(step_id).ok()) {
          ledger.live[step_id] = LiveStep{ids};
          ledger.in_step_samples += static_cast<int64_t>(ids.size());
        } else {
          for (const std::string& id : ids) ledger.free_acked.insert(id);
        }
        ++resolved_in_flight;
      }
      ledger.maybe_created.clear();
      for (const std::string& step_id : ledger.maybe_released) {
        if (!client.GetPlan(step_id).ok()) {
          ledger.live.erase(step_id);
          ledger.released.insert(step_id);
        }
        ++resolved_in_flight;
      }
      ledger.maybe_released.clear();
      int64_t live_samples = 0;
      for (auto& [step_id, step] : ledger.live) {
        absl::StatusOr<v1::Plan> plan = client.GetPlan(step_id);
        ASSERT_TRUE(plan.ok()) << "iteration " << iter << ": acknowledged step " << step_id
                               << " lost: " << plan.status();
        std::set<std::string> in_plan;
        for (const auto& mb : plan->microbatches())
          for (const auto& g : mb.groups())
            for (const auto& id : g.sample_ids()) in_plan.insert(id);
        EXPECT_EQ(in_plan, std::set<std::string>(step.ids.begin(), step.ids.end()));
        absl::StatusOr<uint32_t> digest = StepDigest(channel, step_id, 2);
        ASSERT_TRUE(digest.ok()) << digest.status();
        if (step.has_digest) {
          EXPECT_EQ(*digest, step.digest)
              << "iteration " << iter << ": step " << step_id << " re-served different bytes";
          ++identical_reserves;
        }
        step.has_digest = true;
        step.digest = *digest;
        live_samples += static_cast<int64_t>(step.ids.size());
        ++recovered_steps;
      }
      for (const std::string& step_id : ledger.released) {
        EXPECT_EQ(client.GetPlan(step_id).status().code(), absl::StatusCode::kNotFound)
            << "released step " << step_id << " came back";
        ++verified_released;
      }
      // Every acknowledged free sample is back, with its content: a step over
      // exactly them plans, and its bytes match the reference built from the
      // samples as they were sent.
      if (!ledger.free_acked.empty()) {
        v1::CreateStepRequest create;
        create.set_step_id("verify-" + std::to_string(iter));
        create.set_pool("p");
        for (const std::string& id : ledger.free_acked) create.add_sample_ids(id);
        *create.mutable_topology() = StepTopology(1);
        absl::StatusOr<v1::StepInfo> step = client.CreateStep(create);
        ASSERT_TRUE(step.ok()) << "iteration " << iter << ": " << step.status();
        absl::StatusOr<v1::Plan> plan = client.GetPlan(create.step_id());
        ASSERT_TRUE(plan.ok());
        std::map<std::string, const v1::Sample*> by_id;
        for (const std::string& id : ledger.free_acked) by_id[id] = &ledger.sent.at(id);
        absl::StatusOr<std::vector<v1::Microbatch>> mbs = FetchRank(channel, create.step_id(), 0);
        ASSERT_TRUE(mbs.ok()) << mbs.status();
        ASSERT_EQ(static_cast<int>(mbs->size()), plan->microbatches_size());
        v1::RankCoords rank;
        for (const v1::Microbatch& mb : *mbs) {
          absl::StatusOr<ExpectedMicrobatch> want =
              ReferenceMicrobatch(*plan, Model(), by_id, rank, mb.index());
          ASSERT_TRUE(want.ok()) << want.status();
          absl::Status check = CheckMicrobatch(mb, *want, plan->topology(), rank, Model(), true);
          ASSERT_TRUE(check.ok()) << "iteration " << iter << ": " << check;
        }
        recovered_samples += static_cast<int64_t>(ledger.free_acked.size());
        ASSERT_TRUE(client.ReleaseStep(create.step_id()).ok());
        ledger.released.insert(create.step_id());
        ledger.free_acked.clear();
      }
      absl::StatusOr<v1::PoolInfo> pool = client.GetPool("p");
      ASSERT_TRUE(pool.ok());
      // Anything beyond the live steps' samples is a put cut by a kill
      // whose record made it to the log (recovered, never acknowledged).
      EXPECT_GE(pool->num_samples(), live_samples);
      EXPECT_LE(pool->num_samples() - live_samples,
                static_cast<int64_t>(ledger.maybe_samples.size()));
    }
    if (iter == iterations) {
      (*daemon)->Kill(SIGTERM);
      break;
    }

    // ---- Load, then kill -9 at a random moment.
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int p = 0; p < 3; ++p) {
      threads.emplace_back([&, p] {
        RollpackClient producer(MakeChannel((*daemon)->address(), client_options), client_options);
        SyntheticOptions options;
        options.num_samples = 60;
        options.median_length = 60;
        options.min_length = 8;
        options.max_length = 400;
        options.seed = 1000 * iter + p;
        std::vector<v1::Sample> samples = MakeSyntheticRollouts(Model(), options);
        for (size_t i = 0; i + 3 <= samples.size() && !stop; i += 3) {
          std::vector<v1::Sample> batch(samples.begin() + i, samples.begin() + i + 3);
          for (v1::Sample& s : batch) {
            s.set_sample_id("i" + std::to_string(iter) + "-p" + std::to_string(p) + "-" + s.sample_id());
          }
          {
            absl::MutexLock lock(&ledger.mu);
            for (const v1::Sample& s : batch) ledger.sent[s.sample_id()] = s;
          }
          absl::StatusOr<v1::PutSamplesResponse> put = producer.PutSamples("p", batch);
          absl::MutexLock lock(&ledger.mu);
          for (const v1::Sample& s : batch) {
            if (put.ok()) {
              ledger.free_acked.insert(s.sample_id());
              ledger.acked_samples++;
            } else {
              ledger.maybe_samples.insert(s.sample_id());
            }
          }
          if (!put.ok()) return;
        }
      });
    }
    threads.emplace_back([&] {
      for (int k = 0; !stop; ++k) {
        std::vector<std::string> ids;
        std::string release;
        {
          absl::MutexLock lock(&ledger.mu);
          while (!ledger.free_acked.empty() && ids.size() < 8) {
            ids.push_back(*ledger.free_acked.begin());
            ledger.free_acked.erase(ledger.free_acked.begin());
          }
          if (ledger.live.size() > 2) release = ledger.live.begin()->first;
        }
        if (ids.size() >= 2) {
          v1::CreateStepRequest create;
          create.set_step_id("s" + std::to_string(iter) + "-" + std::to_string(k));
          create.set_pool("p");
          for (const std::string& id : ids) create.add_sample_ids(id);
          *create.mutable_topology() = StepTopology(2);
          absl::StatusOr<v1::StepInfo> step = client.CreateStep(create);
          if (!step.ok()) {
            absl::MutexLock lock(&ledger.mu);
            ledger.maybe_created[create.step_id()] = ids;
            return;
          }
          absl::StatusOr<uint32_t> digest = StepDigest(channel, create.step_id(), 2);
          absl::MutexLock lock(&ledger.mu);
          ledger.acked_steps++;
          ledger.in_step_samples += static_cast<int64_t>(ids.size());
          ledger.live[create.step_id()] = LiveStep{ids, digest.ok(), digest.ok() ? *digest : 0};
          if (!digest.ok()) return;
        } else {
          absl::MutexLock lock(&ledger.mu);
          for (const std::string& id : ids) ledger.free_acked.insert(id);
        }
        if (!release.empty()) {
          absl::StatusOr<v1::ReleaseStepResponse> released = client.ReleaseStep(release);
          absl::MutexLock lock(&ledger.mu);
          if (released.ok()) {
            ledger.live.erase(release);
            ledger.released.insert(release);
            ledger.acked_releases++;
          } else {
            ledger.maybe_released.insert(release);
            return;
          }
        }
        absl::SleepFor(absl::Milliseconds(5));
      }
    });
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(100, 600)(rng)));
    (*daemon)->Kill(SIGKILL);
    stop = true;
    for (std::thread& t : threads) t.join();
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf(
      "crash loop: %d kill -9 restarts; acknowledged samples %lld = recovered and verified "
      "by content %lld + taken into acknowledged steps %lld; acknowledged steps %lld, live steps re-checked %lld times, "
      "byte-identical re-serves %lld; releases %lld, released steps verified gone %lld; "
      "in-flight operations resolved %lld; unacknowledged puts cut by kills %zu\n",
      iterations, static_cast<long long>(ledger.acked_samples),
      static_cast<long long>(recovered_samples),
      static_cast<long long>(ledger.in_step_samples), static_cast<long long>(ledger.acked_steps),
      static_cast<long long>(recovered_steps), static_cast<long long>(identical_reserves),
      static_cast<long long>(ledger.acked_releases), static_cast<long long>(verified_released),
      static_cast<long long>(resolved_in_flight), ledger.maybe_samples.size());
  EXPECT_EQ(ledger.acked_samples, recovered_samples + ledger.in_step_samples);
  EXPECT_GT(ledger.acked_samples, 100);
  EXPECT_GT(identical_reserves, 5);
}

}  // namespace
}  // namespace rollpack
