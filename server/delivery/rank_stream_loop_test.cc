// The encode-and-write loop of a rank's stream against a writer of the
// test's: every micro-batch from start_index on, in order, byte for byte
// what MicrobatchEncoder gives; the next encoded while one is written (and
// a write that completes during that encoding carried on); admission that
// waits or refuses; a writer that holds the stream back and resumes it.
#include "server/delivery/rank_stream_loop.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace {

ModelSpec Model() {
  ModelSpec m;
  m.name = "m";
  m.num_layers = 2;
  m.num_experts = 8;
  m.topk = 2;
  m.moe_layers = {0, 1};
  return m;
}

std::vector<StoredSample> Samples(const ModelSpec& model, int count) {
  std::vector<StoredSample> out;
  for (int i = 0; i < count; ++i) {
    const int64_t n = 40 + 9 * i;
    StoredSample s;
    s.sample_id = "s" + std::to_string(i);
    for (int64_t t = 0; t < n; ++t) s.tokens.push_back(static_cast<int32_t>(i * 1000 + t));
    s.experts.resize(n * 2 * model.topk);
    for (size_t e = 0; e < s.experts.size(); ++e) s.experts[e] = static_cast<char>(e % 8);
    s.row_valid.assign(n, 1);
    out.push_back(std::move(s));
  }
  return out;
}

// A step of several micro-batches for rank (0, 0, 0, 0): tokens per rank
// small against the samples.
std::shared_ptr<const Step> MakeStep(SampleStore* store) {
  const ModelSpec model = Model();
  EXPECT_TRUE(store->RegisterModel("p", model).ok());
  EXPECT_TRUE(store->Put("p", Samples(model, 8)).ok());
  Topology topology;
  topology.max_tokens_per_rank = 128;
  absl::StatusOr<std::shared_ptr<const Step>> step = store->CreateStep("st", "p", {}, 8, topology);
  EXPECT_TRUE(step.ok()) << step.status();
  return step.ok() ? *step : nullptr;
}

// What the stream must carry as micro-batch `index`.
std::string Expected(const Step& step, int index) {
  MicrobatchEncoder encoder;
  MicrobatchRequest request;
  request.rank = {0, 0, 0, 0};
  request.index = index;
  EXPECT_TRUE(encoder.Prepare(step, request).ok());
  std::string bytes(encoder.encoded_size(), '\0');
  EXPECT_TRUE(encoder.Encode(absl::MakeSpan(bytes)).ok());
  return bytes;
}

class StringBuffer final : public MicrobatchWriter::Buffer {
 public:
  explicit StringBuffer(size_t size) : bytes_(size, '\0') {}
  absl::Span<char> bytes() override { return absl::MakeSpan(bytes_); }
  std::string bytes_;
};

// Records what the loop does. Completes each write inside Send when
// `complete_in_send` (before the loop encodes ahead: the race it must carry
// on), else when the test calls Complete().
class FakeWriter final : public MicrobatchWriter {
 public:
  std::unique_ptr<Buffer> NewBuffer(size_t size) override {
    return std::make_unique<StringBuffer>(size);
  }
  Admission Admit(int64_t size, absl::AnyInvocable<void()> resume) override {
    admitted.push_back(size);
    if (admission == Admission::kLater) waiting = std::move(resume);
    return admission;
  }
  void Send(std::unique_ptr<Buffer> buffer) override {
    sent.push_back(static_cast<StringBuffer*>(buffer.get())->bytes_);
    if (complete_in_send) loop->OnWriteDone(true);
  }
  bool AfterWrite(bool ok) override {
    write_results.push_back(ok);
    return !hold_after_write;
  }
  void EndStream(const absl::Status& status) override {
    ++ends;
    end = status;
  }

  RankStreamLoop* loop = nullptr;
  Admission admission = Admission::kNow;
  bool complete_in_send = false;
  bool hold_after_write = false;
  absl::AnyInvocable<void()> waiting;
  std::vector<int64_t> admitted;
  std::vector<std::string> sent;
  std::vector<bool> write_results;
  int ends = 0;
  absl::Status end = absl::UnknownError("not ended");
};

RankStreamSource Source(std::shared_ptr<const Step> step, int start_index, bool ahead) {
  RankStreamSource source;
  source.step = std::move(step);
  source.rank = {0, 0, 0, 0};
  source.start_index = start_index;
  source.encode_ahead = ahead;
  return source;
}

// Completes writes until the loop ends or stops sending.
void Drain(FakeWriter& writer, RankStreamLoop& loop) {
  for (size_t done = 0; writer.ends == 0 && done < writer.sent.size(); ++done) {
    loop.OnWriteDone(true);
  }
}

TEST(RankStreamLoopTest, WritesEveryMicrobatchInOrderThenEnds) {
  SampleStore store(int64_t{1} << 30);
  std::shared_ptr<const Step> step = MakeStep(&store);
  ASSERT_NE(step, nullptr);
  const int num = step->layout.num_microbatches();
  ASSERT_GE(num, 3) << "the step must have several micro-batches";
  for (const bool ahead : {false, true}) {
    for (const int start : {0, 1}) {
      SCOPED_TRACE(testing::Message() << "encode_ahead " << ahead << ", start " << start);
      FakeWriter writer;
      RankStreamLoop loop(&writer);
      writer.loop = &loop;
      ASSERT_TRUE(loop.Start(Source(step, start, ahead)).ok());
      loop.WriteNext();
      Drain(writer, loop);
      ASSERT_EQ(writer.ends, 1);
      EXPECT_TRUE(writer.end.ok()) << writer.end;
      ASSERT_EQ(static_cast<int>(writer.sent.size()), num - start);
      for (int i = start; i < num; ++i) EXPECT_EQ(writer.sent[i - start], Expected(*step, i)) << i;
      EXPECT_EQ(writer.write_results.size(), writer.sent.size());
      EXPECT_FALSE(loop.more_to_write());
      // Only micro-batches encoded when due are admitted: ahead, the first.
      if (ahead) {
        EXPECT_EQ(writer.admitted.size(), 1u);
      } else {
        ASSERT_EQ(static_cast<int>(writer.admitted.size()), num - start);
        for (int i = start; i < num; ++i) {
          EXPECT_EQ(writer.admitted[i - start], static_cast<int64_t>(writer.sent[i - start].size()));
        }
      }
    }
  }
}

TEST(RankStreamLoopTest, AWriteThatCompletesWhileTheNextIsEncodedIsCarriedOn) {
  SampleStore store(int64_t{1} << 30);
  std::shared_ptr<const Step> step = MakeStep(&store);
  ASSERT_NE(step, nullptr);
  const int num = step->layout.num_microbatches();
  FakeWriter writer;
  writer.complete_in_send = true;  // every write done before the encoding ahead ends
  RankStreamLoop loop(&writer);
  writer.loop = &loop;
  ASSERT_TRUE(loop.Start(Source(step, 0, /*ahead=*/true)).ok());
  loop.WriteNext();  // the whole stream on this thread, without recursion
  ASSERT_EQ(writer.ends, 1);
  EXPECT_TRUE(writer.end.ok()) << writer.end;
  ASSERT_EQ(static_cast<int>(writer.sent.size()), num);
  for (int i = 0; i < num; ++i) EXPECT_EQ(writer.sent[i], Expected(*step, i)) << i;
  EXPECT_EQ(static_cast<int>(writer.write_results.size()), num);
}

TEST(RankStreamLoopTest, AdmissionThatWaitsResumesAndOneRefusedEndsTheStream) {
  SampleStore store(int64_t{1} << 30);
  std::shared_ptr<const Step> step = MakeStep(&store);
  ASSERT_NE(step, nullptr);
  FakeWriter writer;
  writer.admission = MicrobatchWriter::Admission::kLater;
  RankStreamLoop loop(&writer);
  writer.loop = &loop;
  ASSERT_TRUE(loop.Start(Source(step, 0, false)).ok());
  loop.WriteNext();
  EXPECT_TRUE(writer.sent.empty()) << "nothing is encoded before it is admitted";
  ASSERT_TRUE(writer.waiting);
  writer.admission = MicrobatchWriter::Admission::kNow;
  std::move(writer.waiting)();
  ASSERT_EQ(writer.sent.size(), 1u);
  EXPECT_EQ(writer.sent[0], Expected(*step, 0));

  writer.admission = MicrobatchWriter::Admission::kNever;
  loop.OnWriteDone(true);
  EXPECT_EQ(writer.sent.size(), 1u);
  ASSERT_EQ(writer.ends, 1);
  EXPECT_EQ(writer.end.code(), absl::StatusCode::kCancelled);
}

TEST(RankStreamLoopTest, AWriterThatHoldsTheStreamBackResumesItWhereItWas) {
  SampleStore store(int64_t{1} << 30);
  std::shared_ptr<const Step> step = MakeStep(&store);
  ASSERT_NE(step, nullptr);
  for (const bool ahead : {false, true}) {
    SCOPED_TRACE(testing::Message() << "encode_ahead " << ahead);
    FakeWriter writer;
    writer.hold_after_write = true;  // as the first-delivery gate does
    RankStreamLoop loop(&writer);
    writer.loop = &loop;
    ASSERT_TRUE(loop.Start(Source(step, 0, ahead)).ok());
    loop.WriteNext();
    loop.OnWriteDone(true);
    EXPECT_EQ(writer.sent.size(), 1u) << "held: nothing more written";
    EXPECT_TRUE(loop.more_to_write());
    writer.hold_after_write = false;
    loop.WriteNext();
    ASSERT_EQ(writer.sent.size(), 2u);
    EXPECT_EQ(writer.sent[1], Expected(*step, 1));
    // A write the transport failed is reported as such; the writer ends it.
    writer.hold_after_write = true;
    loop.OnWriteDone(false);
    EXPECT_FALSE(writer.write_results.back());
    EXPECT_EQ(writer.sent.size(), 2u);
  }
}

TEST(RankStreamLoopTest, StartOutsideTheStepIsRefusedAndStartAtTheEndEndsAtOnce) {
  SampleStore store(int64_t{1} << 30);
  std::shared_ptr<const Step> step = MakeStep(&store);
  ASSERT_NE(step, nullptr);
  const int num = step->layout.num_microbatches();
  FakeWriter refused_writer;
  RankStreamLoop refused(&refused_writer);
  absl::Status past = refused.Start(Source(step, num + 1, false));
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(past.message().find("start_index " + std::to_string(num + 1)), std::string::npos)
      << past;
  EXPECT_EQ(refused.Start(Source(step, -1, false)).code(), absl::StatusCode::kOutOfRange);

  FakeWriter writer;
  RankStreamLoop loop(&writer);
  ASSERT_TRUE(loop.Start(Source(step, num, false)).ok());
  loop.WriteNext();
  EXPECT_TRUE(writer.sent.empty());
  ASSERT_EQ(writer.ends, 1);
  EXPECT_TRUE(writer.end.ok());
}

}  // namespace
}  // namespace rollpack
