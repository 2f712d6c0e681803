// A trainer rank rides out a kill -9 and restart of a durable rollpackd
// (issue 17): its stream resumes with backoff once the daemon serves again
// on the same port from the same --data-dir, and the micro-batches it yields
// are byte-identical to an uninterrupted read. A daemon that stays down ends
// the stream after resume_timeout with UNAVAILABLE naming, in its message
// and its payload, the micro-batch to resume from; resuming there later
// completes the rank byte-identically.
#include <signal.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/stream_resume.h"
#include "client/cpp/trainer_stream.h"
#include "client/trainer/device_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/wire/deterministic_bytes.h"
#include "testing/durable_daemon_test.h"
#include "testing/synthetic_rollouts.h"

#ifndef ROLLPACKD_PATH
#error "ROLLPACKD_PATH must name the rollpackd binary"
#endif

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// Micro-batches of about 1 MiB (8192 tokens x 16 layers x K 8 uint8 ids),
// and a rank of ~30 of them: far more than gRPC's flow-control windows and
// the client's 8 MiB stream window hold, so a kill cuts the stream in the
// middle instead of after the client already buffered all of it.
v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("restart-model");
  m.set_num_layers(16);
  m.set_num_experts(64);
  m.set_topk(8);
  return m;
}

class TrainerRestartTest : public DurableDaemonTest {
 protected:
  TrainerRestartTest() : DurableDaemonTest(ROLLPACKD_PATH) {}

  // A step "s" of one data-parallel rank with at least 25 micro-batches;
  // returns that rank's bytes read uninterrupted.
  std::vector<std::string> CreateStep() {
    RollpackClient client(MakeChannel(daemon_->address()));
    EXPECT_TRUE(client.RegisterModel("p", Model()).ok());
    SyntheticOptions options;
    options.num_samples = 256;
    options.median_length = 1500;
    options.max_length = 8000;
    options.mixed_forms = false;
    options.narrow_when_uniform = true;
    absl::StatusOr<v1::PutSamplesResponse> put =
        client.PutSamples("p", MakeSyntheticRollouts(Model(), options));
    EXPECT_TRUE(put.ok()) << put.status();
    v1::CreateStepRequest create;
    create.set_step_id("s");
    create.set_pool("p");
    create.set_num_samples(options.num_samples);
    create.mutable_topology()->set_dp(1);
    create.mutable_topology()->set_max_tokens_per_rank(8192);
    absl::StatusOr<v1::StepInfo> step = client.CreateStep(create);
    EXPECT_TRUE(step.ok()) << step.status();
    std::vector<std::string> bytes = ReadAll(TrainerStreamOptions());
    EXPECT_GE(bytes.size(), 25u);
    return bytes;
  }

  // Every micro-batch of the rank from options.start_index, on a fresh
  // channel.
  std::vector<std::string> ReadAll(const TrainerStreamOptions& options) {
    TrainerStream stream(MakeChannel(daemon_->address()), "s", v1::RankCoords(), options);
    std::vector<std::string> out;
    while (true) {
      absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok() || !next->has_value()) return out;
      out.push_back(DeterministicBytes(**next));
    }
  }

};

TEST_F(TrainerRestartTest, StreamsRideOutAKillDashNineAndRestartOnTheSamePort) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::vector<std::string> reference = CreateStep();
  ASSERT_GE(reference.size(), 10u);
  const int port = daemon_->port();

  // The C++ stream and the device stream's host path (what the C ABI and
  // Python use), each on its own channel as trainer ranks have.
  TrainerStreamOptions options;
  options.prefetch = 1;
  options.resume_timeout = absl::Seconds(30);
  TrainerStream stream(MakeChannel(daemon_->address()), "s", v1::RankCoords(), options);
  DeviceStreamOptions device_options;
  device_options.device = -1;
  device_options.prefetch = 1;
  device_options.resume_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<DeviceStream>> device = DeviceStream::Open(
      MakeChannel(daemon_->address()), "s", v1::RankCoords(), device_options);
  ASSERT_TRUE(device.ok()) << device.status();

  std::vector<std::string> got, got_device;
  absl::Status error, device_error;
  // Each rank's consumer keeps asking while the daemon is down, as a
  // training loop does: it drains what was received and then waits in
  // Next() through the outage.
  auto read = [&](int n) {
    while (static_cast<int>(got.size()) < n) {
      absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
      if (!next.ok() || !next->has_value()) {
        error = next.ok() ? absl::OutOfRangeError("ended early") : next.status();
        return;
      }
      got.push_back(DeterministicBytes(**next));
    }
  };
  auto read_device = [&](int n) {
    while (static_cast<int>(got_device.size()) < n) {
      absl::StatusOr<std::shared_ptr<DeviceBatch>> next = (*device)->Next();
      if (!next.ok() || *next == nullptr) {
        device_error = next.ok() ? absl::OutOfRangeError("ended early") : next.status();
        return;
      }
      got_device.push_back(DeterministicBytes((*next)->meta()));
    }
  };
  read(3);
  read_device(3);
  ASSERT_TRUE(error.ok()) << error;
  ASSERT_TRUE(device_error.ok()) << device_error;

  daemon_->Kill(SIGKILL);
  const absl::Time killed = absl::Now();
  const int n = static_cast<int>(reference.size());
  std::thread reader([&] { read(n); });
  std::thread device_reader([&] { read_device(n); });
  // Restarted from this thread: the daemon's PR_SET_PDEATHSIG follows the
  // thread that forked it.
  absl::SleepFor(absl::Seconds(2));
  StartDaemon(port);
  reader.join();
  device_reader.join();
  if (HasFatalFailure()) return;
  ASSERT_TRUE(error.ok()) << error;
  ASSERT_TRUE(device_error.ok()) << device_error;
  absl::StatusOr<std::optional<v1::Microbatch>> end = stream.Next();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_FALSE(end->has_value());
  absl::StatusOr<std::shared_ptr<DeviceBatch>> device_end = (*device)->Next();
  ASSERT_TRUE(device_end.ok()) << device_end.status();
  EXPECT_EQ(*device_end, nullptr);
  // Found within seconds of the restart (2 s after the kill): waits are
  // capped and the channel's reconnection too.
  EXPECT_LT(absl::Now() - killed, absl::Seconds(12));

  // The stream was down while the consumer waited (backoff from 100 ms
  // makes several attempts in 2 s), and nothing was lost or repeated.
  EXPECT_GE(stream.resumes(), 3);
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(got[i] == reference[i]) << "micro-batch " << i << " differs after the restart";
    EXPECT_TRUE(got_device[i] == reference[i])
        << "device stream micro-batch " << i << " differs after the restart";
  }
}

TEST_F(TrainerRestartTest, ADaemonThatStaysDownEndsTheStreamAfterTheBudgetNamingWhereToResume) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::vector<std::string> reference = CreateStep();
  ASSERT_GE(reference.size(), 10u);
  const int port = daemon_->port();

  // Errors that are not transient end the stream at once, with the index too.
  {
    TrainerStreamOptions o;
    o.start_index = 3;
    TrainerStream missing(MakeChannel(daemon_->address()), "no-such-step", v1::RankCoords(), o);
    absl::StatusOr<std::optional<v1::Microbatch>> next = missing.Next();
    ASSERT_FALSE(next.ok());
    EXPECT_EQ(next.status().code(), absl::StatusCode::kNotFound) << next.status();
    EXPECT_EQ(ResumeFrom(next.status()), 3) << next.status();
    EXPECT_THAT(std::string(next.status().message()), HasSubstr("resume from micro-batch 3"));
  }

  const absl::Duration budget = absl::Seconds(3);
  TrainerStreamOptions options;
  options.prefetch = 1;
  options.resume_timeout = budget;
  options.backoff.max = absl::Seconds(1);
  TrainerStream stream(MakeChannel(daemon_->address()), "s", v1::RankCoords(), options);
  std::vector<std::string> got;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
    ASSERT_TRUE(next.ok() && next->has_value()) << next.status();
    got.push_back(DeterministicBytes(**next));
  }
  daemon_->Kill(SIGKILL);
  const absl::Time killed = absl::Now();
  // What was received before the kill still comes out, then the error.
  absl::Status error;
  while (true) {
    absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
    if (!next.ok()) {
      error = next.status();
      break;
    }
    ASSERT_TRUE(next->has_value()) << "the stream ended cleanly without its server";
    got.push_back(DeterministicBytes(**next));
  }
  const absl::Duration waited = absl::Now() - killed;
  ASSERT_LT(got.size(), reference.size());
  EXPECT_GE(waited, budget) << "gave up before resume_timeout";
  EXPECT_LT(waited, budget + absl::Seconds(3)) << "kept trying past resume_timeout";
  EXPECT_GE(stream.resumes(), 3) << "backoff from 100 ms makes several attempts in 3 s";
  EXPECT_EQ(error.code(), absl::StatusCode::kUnavailable) << error;
  const std::string resume = absl::StrCat("resume from micro-batch ", got.size());
  EXPECT_THAT(std::string(error.message()), HasSubstr(resume));
  EXPECT_THAT(std::string(error.message()), HasSubstr("resume_timeout 3s"));
  EXPECT_THAT(std::string(error.message()), HasSubstr("step \"s\" rank (dp=0, cp=0, tp=0, pp=0)"));
  EXPECT_EQ(ResumeFrom(error), static_cast<int64_t>(got.size())) << error;

  // max_resumes = 0: no resuming at all, and the device stream (whose
  // options reach the network side) names the index it was opened at.
  {
    DeviceStreamOptions o;
    o.device = -1;
    o.start_index = 5;
    o.max_resumes = 0;
    const absl::Time asked = absl::Now();
    absl::StatusOr<std::unique_ptr<DeviceStream>> d =
        DeviceStream::Open(MakeChannel(absl::StrCat("127.0.0.1:", port)), "s", v1::RankCoords(), o);
    ASSERT_TRUE(d.ok()) << d.status();
    absl::StatusOr<std::shared_ptr<DeviceBatch>> next = (*d)->Next();
    ASSERT_FALSE(next.ok());
    EXPECT_LT(absl::Now() - asked, absl::Seconds(2)) << "max_resumes = 0 still resumed";
    EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable) << next.status();
    EXPECT_EQ(ResumeFrom(next.status()), 5) << next.status();
    EXPECT_THAT(std::string(next.status().message()), HasSubstr("max_resumes 0"));
  }

  // The index is right: resuming there completes the rank byte-identically.
  ASSERT_NO_FATAL_FAILURE(StartDaemon(port));
  TrainerStreamOptions rest;
  rest.start_index = static_cast<int>(*ResumeFrom(error));
  for (std::string& bytes : ReadAll(rest)) got.push_back(std::move(bytes));
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(got[i] == reference[i]) << "micro-batch " << i << " differs after resuming";
  }
}

}  // namespace
}  // namespace rollpack
