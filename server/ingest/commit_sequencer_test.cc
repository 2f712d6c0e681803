// Commits of one PutSamples call run in message order whatever order the
// messages become ready in and whatever stream carries them; a refusal, an
// early end of a stream or an abort commits nothing after it.
#include "server/ingest/commit_sequencer.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

// Records what the sequencer did with each message.
class Recorder {
 public:
  CommitSequencer::Commit CommitOf(int64_t index, absl::Status result = absl::OkStatus()) {
    return [this, index, result](CommitSequencer::CallState& call) -> absl::StatusOr<int64_t> {
      absl::MutexLock lock(&mu_);
      committed_.push_back(index);
      // The state commits share: each sees the one before it.
      pools_seen_.push_back(call.pool);
      call.pool = absl::StrCat("after-", index);
      if (!result.ok()) return result;
      return 10;  // samples per message
    };
  }
  CommitSequencer::Done DoneOf(int64_t index) {
    return [this, index](absl::Status status) {
      absl::MutexLock lock(&mu_);
      done_.emplace_back(index, std::move(status));
    };
  }
  std::vector<int64_t> committed() {
    absl::MutexLock lock(&mu_);
    return committed_;
  }
  std::vector<std::string> pools_seen() {
    absl::MutexLock lock(&mu_);
    return pools_seen_;
  }
  std::vector<std::pair<int64_t, absl::Status>> done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  absl::Status DoneStatus(int64_t index) {
    absl::MutexLock lock(&mu_);
    for (const auto& [i, s] : done_) {
      if (i == index) return s;
    }
    return absl::UnknownError("no done");
  }

 private:
  absl::Mutex mu_;
  std::vector<int64_t> committed_;
  std::vector<std::string> pools_seen_;
  std::vector<std::pair<int64_t, absl::Status>> done_;
};

TEST(CommitSequencerTest, CommitsInIndexOrder) {
  auto sequencer = CommitSequencer::Create();
  Recorder r;
  for (int64_t i : {2, 0, 3, 1}) sequencer->Submit(i, r.CommitOf(i), r.DoneOf(i));
  EXPECT_EQ(r.committed(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(r.pools_seen(), (std::vector<std::string>{"", "after-0", "after-1", "after-2"}));
  ASSERT_EQ(r.done().size(), 4u);
  for (const auto& [i, s] : r.done()) EXPECT_TRUE(s.ok()) << i << ": " << s;
}

TEST(CommitSequencerTest, StripesFromManyThreadsCommitInCallOrder) {
  constexpr int kStripes = 4;
  constexpr int kPerStripe = 200;
  auto sequencer = CommitSequencer::Create(kStripes);
  Recorder r;
  std::vector<std::thread> threads;
  for (int s = 0; s < kStripes; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937 random(s);
      for (int k = 0; k < kPerStripe; ++k) {
        if (random() % 4 == 0) std::this_thread::yield();
        const int64_t index = int64_t{k} * kStripes + s;
        sequencer->Submit(index, r.CommitOf(index), r.DoneOf(index));
      }
      sequencer->EndStripe(s, kPerStripe);
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<int64_t> expected(kStripes * kPerStripe);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int64_t>(i);
  EXPECT_EQ(r.committed(), expected);
  EXPECT_EQ(r.done().size(), expected.size());
  // One call state for all the streams, handed on in call order.
  const std::vector<std::string> pools = r.pools_seen();
  ASSERT_EQ(pools.size(), expected.size());
  for (size_t i = 1; i < pools.size(); ++i) ASSERT_EQ(pools[i], absl::StrCat("after-", i - 1));
}

// Each stream holds the sequencer until its message's done, as the reactors
// do; the done of one stream's message may run on another thread (the one
// draining) while the stream's own Submit is still on its way out. Submit
// must not touch the sequencer after that (ASan, tools/ci_extra.sh, sees it
// when a round hits the window).
TEST(CommitSequencerTest, ADoneMayDropTheLastReferenceDuringSubmit) {
  const auto commit = [](CommitSequencer::CallState&) -> absl::StatusOr<int64_t> { return 1; };
  for (int round = 0; round < 2000; ++round) {
    std::shared_ptr<CommitSequencer> first = CommitSequencer::Create(2);
    std::shared_ptr<CommitSequencer> second = first;
    CommitSequencer* const sequencer = first.get();
    std::thread other([&, ref = std::move(second)]() mutable {
      sequencer->Submit(1, commit, [ref = std::move(ref)](absl::Status) mutable { ref.reset(); });
    });
    sequencer->Submit(0, commit, [ref = std::move(first)](absl::Status) mutable { ref.reset(); });
    other.join();
  }
}

TEST(CommitSequencerTest, RefusalEndsTheCall) {
  auto sequencer = CommitSequencer::Create(3);
  Recorder r;
  for (int64_t i : {4, 0, 1}) sequencer->Submit(i, r.CommitOf(i), r.DoneOf(i));
  sequencer->Submit(2, r.CommitOf(2, absl::InvalidArgumentError("sample \"x\": bad")), r.DoneOf(2));
  sequencer->Submit(3, r.CommitOf(3), r.DoneOf(3));
  EXPECT_EQ(r.committed(), (std::vector<int64_t>{0, 1, 2}));
  const absl::Status refused = r.DoneStatus(2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(),
            "sample \"x\": bad [20 samples of earlier messages of this call (3 streams) were "
            "committed; this message's were not]");
  for (int64_t later : {3, 4}) {
    EXPECT_EQ(r.DoneStatus(later).code(), absl::StatusCode::kAborted) << later;
    EXPECT_NE(r.DoneStatus(later).message().find("sample \"x\": bad"), std::string::npos);
  }
}

TEST(CommitSequencerTest, OneStreamNamesTheStream) {
  auto sequencer = CommitSequencer::Create();
  Recorder r;
  sequencer->Submit(0, r.CommitOf(0), r.DoneOf(0));
  sequencer->Submit(1, r.CommitOf(1, absl::AlreadyExistsError("id")), r.DoneOf(1));
  EXPECT_EQ(r.DoneStatus(1).message(),
            "id [10 samples of earlier messages of this stream were committed; this message's "
            "were not]");
}

TEST(CommitSequencerTest, AStreamThatEndsEarlyStopsTheCallAtItsGap) {
  auto sequencer = CommitSequencer::Create(2);
  Recorder r;
  // Stream 1 carries messages 1, 3, 5, ...; it ends after one.
  for (int64_t i : {0, 2, 4, 1}) sequencer->Submit(i, r.CommitOf(i), r.DoneOf(i));
  sequencer->EndStripe(1, 1);
  EXPECT_EQ(r.committed(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(r.DoneStatus(4).code(), absl::StatusCode::kAborted);
  EXPECT_NE(r.DoneStatus(4).message().find("message 3 of this call never arrived"),
            std::string::npos)
      << r.DoneStatus(4);
  // A stream that ends after its last message stops nothing.
  sequencer->EndStripe(0, 3);
  EXPECT_EQ(r.done().size(), 4u);
}

TEST(CommitSequencerTest, AbortDropsWhatIsWaitingAndWhatComesLater) {
  auto sequencer = CommitSequencer::Create(2);
  Recorder r;
  sequencer->Submit(1, r.CommitOf(1), r.DoneOf(1));
  sequencer->Abort(absl::AbortedError("stream 0 cancelled"));
  sequencer->Submit(0, r.CommitOf(0), r.DoneOf(0));
  EXPECT_TRUE(r.committed().empty());
  EXPECT_EQ(r.DoneStatus(0).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(r.DoneStatus(1).code(), absl::StatusCode::kAborted);
}

TEST(CommitSequencerTest, AnIndexSubmittedTwiceFailsTheCall) {
  auto sequencer = CommitSequencer::Create();
  Recorder r;
  sequencer->Submit(1, r.CommitOf(1), r.DoneOf(1));
  sequencer->Submit(1, r.CommitOf(1), r.DoneOf(1));
  EXPECT_TRUE(r.committed().empty());
  ASSERT_EQ(r.done().size(), 2u);
  for (const auto& [i, s] : r.done()) EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
}

TEST(StripedCallsTest, StreamsOfOneCallShareItsSequencer) {
  StripedCalls calls;
  int stripe = -1;
  auto a = calls.Join("call-0001/0/3", &stripe);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(stripe, 0);
  EXPECT_EQ((*a)->stripes(), 3);
  EXPECT_EQ(calls.waiting(), 1);
  auto b = calls.Join("call-0001/2/3", &stripe);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(stripe, 2);
  EXPECT_EQ(a->get(), b->get());
  auto other = calls.Join("call-0002/0/3", &stripe);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(a->get(), other->get());
  auto c = calls.Join("call-0001/1/3", &stripe);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(a->get(), c->get());
  EXPECT_EQ(calls.waiting(), 1);  // call-0002 only
}

TEST(StripedCallsTest, RefusesMalformedAndConflictingStreams) {
  StripedCalls calls;
  int stripe = -1;
  for (const char* value : {"", "call-0001", "call-0001/0", "short/0/2", "call 0001/0/2",
                            "call-0001/2/2", "call-0001/-1/2", "call-0001/0/0", "call-0001/0/65",
                            "call-0001/x/2"}) {
    EXPECT_EQ(calls.Join(value, &stripe).status().code(), absl::StatusCode::kInvalidArgument)
        << value;
  }
  ASSERT_TRUE(calls.Join("call-0001/0/2", &stripe).ok());
  absl::Status twice = calls.Join("call-0001/0/2", &stripe).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("already joined"), std::string::npos) << twice;
  absl::Status count = calls.Join("call-0001/1/3", &stripe).status();
  EXPECT_NE(count.message().find("the call has 2 streams"), std::string::npos) << count;
}

TEST(StripedCallsTest, ACallWhoseStreamsNeverAllArriveIsAbortedAndItsLateStreamsRefused) {
  StripedCalls calls(absl::Milliseconds(50));
  int stripe = -1;
  auto waiting = calls.Join("call-0001/0/2", &stripe);
  ASSERT_TRUE(waiting.ok());
  Recorder r;
  (*waiting)->Submit(2, r.CommitOf(2), r.DoneOf(2));  // waits for message 1
  // Aborted by the sweeper, with no other call arriving.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (r.done().empty() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(r.DoneStatus(2).code(), absl::StatusCode::kDeadlineExceeded) << r.DoneStatus(2);
  EXPECT_TRUE(r.committed().empty());
  EXPECT_EQ(calls.waiting(), 0);
  // The stream that was waited for, late: told, not started as a new call.
  absl::Status late = calls.Join("call-0001/1/2", &stripe).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_EQ(calls.waiting(), 0);
}

// A call that ended before its other streams came (its stream was cancelled,
// or refused) stops counting against the bound at the next sweep, not after
// the join timeout; its late streams are told it ended.
TEST(StripedCallsTest, ACallThatEndsBeforeItsStreamsCameStopsWaiting) {
  StripedCalls calls(absl::Seconds(2), /*max_waiting=*/1);
  int stripe = -1;
  auto first = calls.Join("call-0001/0/2", &stripe);
  ASSERT_TRUE(first.ok());
  (*first)->Abort(absl::AbortedError("stream 0 was cancelled"));
  const absl::Time give_up = absl::Now() + absl::Seconds(1.5);  // before the join timeout
  while (calls.waiting() > 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(calls.waiting(), 0);
  EXPECT_TRUE(calls.Join("call-0002/0/2", &stripe).ok());
  absl::Status late = calls.Join("call-0001/1/2", &stripe).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_NE(late.message().find("stream 0 was cancelled"), std::string::npos) << late;
}

TEST(StripedCallsTest, BoundsTheCallsWaitingForStreams) {
  StripedCalls calls(absl::Minutes(5), /*max_waiting=*/1);
  int stripe = -1;
  // A call whose streams have all arrived is not waiting.
  auto joined = calls.Join("call-0000/0/1", &stripe);
  ASSERT_TRUE(joined.ok());
  ASSERT_TRUE(calls.Join("call-0001/0/2", &stripe).ok());
  EXPECT_EQ(calls.Join("call-0002/0/2", &stripe).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(calls.Join("call-0001/1/2", &stripe).ok());
  EXPECT_TRUE(calls.Join("call-0002/0/2", &stripe).ok());
}

}  // namespace
}  // namespace rollpack
