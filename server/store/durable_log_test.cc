// Durable mode at the store level: a store with a log, reopened, holds what
// was acknowledged; torn tails are dropped, corruption is refused, a full
// disk refuses the write and changes nothing, compaction keeps the state.
#include "server/store/durable_log.h"
#include "server/store/crc32c.h"
#include "server/store/log_replay.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "testing/durable_store.h"
#include "testing/synthetic_rollouts.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/convert.h"
#include "server/store/sample_store.h"
#include "server/ingest/sample_validation.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("qwen-like");
  m.set_num_layers(4);
  m.set_num_experts(64);
  m.set_topk(4);
  return m;
}

std::vector<StoredSample> Samples(int num, uint64_t seed, const std::string& prefix) {
  SyntheticOptions options;
  options.num_samples = num;
  options.median_length = 200;
  options.max_length = 1024;
  options.seed = seed;
  std::vector<StoredSample> out;
  for (v1::Sample& s : MakeSyntheticRollouts(Model(), options)) {
    s.set_sample_id(prefix + s.sample_id());
    absl::StatusOr<StoredSample> stored = ValidateSample(s, FromProto(Model()));
    EXPECT_TRUE(stored.ok()) << stored.status();
    out.push_back(*std::move(stored));
  }
  return out;
}

Topology SmallTopology() {
  Topology t;
  t.dp = 2;
  t.max_tokens_per_rank = 2048;
  return t;
}

// Everything observable of a step that trainers depend on.
std::string StepFingerprint(const Step& step) {
  std::string out = step.step_id + "|" + step.pool + "|";
  for (const auto& s : step.samples) out += s->sample_id + ",";
  out += "|" + std::to_string(step.plan.microbatches.size());
  for (const PlanMicrobatch& mb : step.plan.microbatches) {
    for (const PlanGroup& g : mb.groups) {
      out += "[" + std::to_string(g.first_rank) + ":" + std::to_string(g.cp_size);
      for (int i : g.sequences) out += "," + std::to_string(i);
      out += "]";
    }
  }
  return out;
}

TEST(Crc32cTest, KnownAnswer) {
  // RFC 3720 test vector: 32 bytes of zeros, and "123456789".
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  // Incremental equals one-shot.
  EXPECT_EQ(Crc32c("56789", Crc32c("1234")), 0xE3069283u);
}

TEST(DurableLogTest, ReopenedStoreHoldsWhatWasAcknowledged) {
  TempDir dir;
  std::vector<StoredSample> a = Samples(24, 1, "a-");
  std::string fingerprint;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(*d->store->RegisterModel("p", FromProto(Model())));
    ASSERT_TRUE(d->store->Put("p", a).ok());
    // An identical re-send is a duplicate and adds no record.
    const int64_t before = d->log->file_bytes();
    ASSERT_EQ(d->store->Put("p", {a[0]})->duplicates, 1);
    EXPECT_EQ(d->log->file_bytes(), before);
    std::vector<std::string> ids;
    for (int i = 0; i < 8; ++i) ids.push_back(a[i].sample_id);
    absl::StatusOr<std::shared_ptr<const Step>> s1 =
        d->store->CreateStep("s1", "p", ids, 0, SmallTopology());
    ASSERT_TRUE(s1.ok()) << s1.status();
    absl::StatusOr<std::shared_ptr<const Step>> s2 =
        d->store->CreateStep("s2", "p", {}, 8, SmallTopology());
    ASSERT_TRUE(s2.ok()) << s2.status();
    fingerprint = StepFingerprint(**s2);
    ASSERT_TRUE(d->store->ReleaseStep("s1").ok());
  }
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->info.torn_tail_bytes, 0);
  EXPECT_EQ(d->info.records, 5);  // register, put, create, create, release
  absl::StatusOr<PoolStats> pool = d->store->GetPool("p");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_samples, 16);
  EXPECT_EQ(pool->num_free_samples, 8);
  EXPECT_EQ(pool->num_live_steps, 1);
  EXPECT_EQ(d->store->GetStep("s1").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::shared_ptr<const Step>> s2 = d->store->GetStep("s2");
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(StepFingerprint(**s2), fingerprint);
  for (size_t i = 0; i < (*s2)->samples.size(); ++i) {
    EXPECT_TRUE(*(*s2)->samples[i] == a[8 + i]) << "sample content differs after recovery";
  }
  // The free samples come back in arrival order: the next step takes a[16..24).
  absl::StatusOr<std::shared_ptr<const Step>> s3 =
      d->store->CreateStep("s3", "p", {}, 8, SmallTopology());
  ASSERT_TRUE(s3.ok());
  EXPECT_EQ((*s3)->samples.front()->sample_id, a[16].sample_id);
}

// Writes a log with `n` put records and returns the record boundaries.
std::vector<int64_t> WriteRecords(const std::string& dir, int n) {
  absl::StatusOr<Durable> d = OpenDurable(dir);
  EXPECT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->store->RegisterModel("p", FromProto(Model())).ok());
  std::vector<int64_t> ends = {d->log->file_bytes()};
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(d->store->Put("p", Samples(2, 100 + i, "r" + std::to_string(i) + "-")).ok());
    ends.push_back(d->log->file_bytes());
  }
  return ends;
}

TEST(DurableLogTest, ADataDirServesOneProcessAtATime) {
  TempDir dir;
  DurableLogOptions options;
  options.dir = dir.path();
  std::vector<LogRecord> records;
  RecoveryInfo info;
  absl::StatusOr<std::unique_ptr<DurableLog>> first = DurableLog::Open(options, &records, &info);
  ASSERT_TRUE(first.ok()) << first.status();
  // Another open of the same directory (another rollpackd, or this one by
  // mistake) is refused while the first holds it, naming the holder.
  absl::StatusOr<std::unique_ptr<DurableLog>> second = DurableLog::Open(options, &records, &info);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(absl::StrCat("in use by another rollpackd (pid ", getpid(), ")")));
  // Compaction renames the log: the lock stays with the directory.
  ASSERT_TRUE((*first)->Rewrite([](DurableLog::Rewriter*) { return absl::OkStatus(); }).ok());
  EXPECT_FALSE(DurableLog::Open(options, &records, &info).ok());
  first->reset();
  absl::StatusOr<std::unique_ptr<DurableLog>> after = DurableLog::Open(options, &records, &info);
  EXPECT_TRUE(after.ok()) << after.status();
}

TEST(DurableLogTest, TornTailIsDroppedAtEveryCutPoint) {
  TempDir dir;
  const std::vector<int64_t> ends = WriteRecords(dir.path(), 3);
  const std::string path = dir.path() + "/rollpack.log";
  std::string full;
  {
    std::ifstream in(path, std::ios::binary);
    full.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_EQ(static_cast<int64_t>(full.size()), ends.back());
  // Cut the last record at a spread of points, header included.
  const int64_t start = ends[ends.size() - 2];
  for (int64_t cut = start + 1; cut < ends.back(); cut += std::max<int64_t>(1, (ends.back() - start) / 37)) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(full.data(), cut);
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << "cut at " << cut << ": " << d.status();
    EXPECT_EQ(d->info.torn_tail_bytes, cut - start);
    EXPECT_EQ(d->store->GetPool("p")->num_samples, 4) << "cut at " << cut;
    EXPECT_EQ(d->log->file_bytes(), start) << "the torn tail is cut off the file";
  }
  // A flipped byte in the last record: a torn write too.
  std::string flipped = full;
  flipped[flipped.size() - 3] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(flipped.data(), flipped.size());
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->store->GetPool("p")->num_samples, 4);
    // Writing goes on after the dropped tail, and is recovered.
    ASSERT_TRUE(d->store->Put("p", Samples(1, 999, "after-")).ok());
  }
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->info.torn_tail_bytes, 0);
    EXPECT_EQ(d->store->GetPool("p")->num_samples, 5);
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

TEST(DurableLogTest, ADamagedLengthIsRefusedNotTakenForATornTail) {
  TempDir dir;
  const std::vector<int64_t> ends = WriteRecords(dir.path(), 4);
  const std::string path = dir.path() + "/rollpack.log";
  std::string damaged = ReadFile(path);
  // The high byte of a mid-log record's length: version 1 read the record
  // as running past the end of the file and cut half the log away.
  damaged[ends[1] + 3] ^= 0x40;
  WriteFile(path, damaged);
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << d.status();
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("offset " + std::to_string(ends[1]) + " has a header that fails"));
  EXPECT_EQ(ReadFile(path), damaged) << "a refused log is left exactly as it was";
}

TEST(DurableLogTest, EveryBitFlipIsRefusedOrCutIntoASideFile) {
  TempDir dir;
  const std::vector<int64_t> ends = WriteRecords(dir.path(), 3);
  const std::string path = dir.path() + "/rollpack.log";
  const std::string full = ReadFile(path);
  const int64_t last_start = ends[ends.size() - 2];
  std::mt19937 rng(7);
  int refused = 0, cut = 0;
  for (int trial = 0; trial < 900; ++trial) {
    // Every bit of the first 64 bytes (file header, first record header),
    // then random bits over the whole file.
    const bool exhaustive = trial < 64 * 8;
    const size_t byte = exhaustive ? trial / 8 : rng() % full.size();
    std::string damaged = full;
    damaged[byte] ^= static_cast<char>(1 << (exhaustive ? trial % 8 : rng() % 8));
    WriteFile(path, damaged);
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      if (entry.path().filename().string().rfind("rollpack.log.cut-", 0) == 0) {
        std::filesystem::remove(entry.path());
      }
    }
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    if (!d.ok()) {
      ++refused;
      EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << "byte " << byte;
      EXPECT_EQ(ReadFile(path), damaged) << "byte " << byte << ": a refused log is left as it was";
      continue;
    }
    // Recovered: only the last record's payload can be cut, and the cut
    // bytes are kept, never just dropped.
    ++cut;
    EXPECT_GE(static_cast<int64_t>(byte), last_start + kLogRecordHeaderBytes) << "byte " << byte;
    EXPECT_EQ(d->info.torn_tail_bytes, ends.back() - last_start) << "byte " << byte;
    EXPECT_EQ(ReadFile(d->info.cut_file), damaged.substr(last_start)) << "byte " << byte;
    EXPECT_FALSE(d->info.cut_reason.empty());
    EXPECT_EQ(d->store->GetPool("p")->num_samples, 4) << "byte " << byte;
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(cut, 0);
}

TEST(DurableLogTest, AVersionOneLogIsReadAndRewrittenAsVersionTwo) {
  TempDir dir;
  WriteRecords(dir.path(), 3);
  const std::string path = dir.path() + "/rollpack.log";
  // The same records in version 1's framing: no header checksum.
  const std::string v2 = ReadFile(path);
  std::string v1 = "RPLOG001";
  for (size_t pos = 8; pos < v2.size();) {
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i) length |= uint32_t{static_cast<unsigned char>(v2[pos + i])} << (8 * i);
    v1 += v2.substr(pos, 9) + v2.substr(pos + kLogRecordHeaderBytes, length);
    pos += kLogRecordHeaderBytes + length;
  }
  WriteFile(path, v1);
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->info.converted_from_v1);
    EXPECT_EQ(d->store->GetPool("p")->num_samples, 6);
  }
  EXPECT_EQ(ReadFile(path), v2) << "rewritten byte for byte in version 2";
  absl::StatusOr<Durable> again = OpenDurable(dir.path());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->info.converted_from_v1);
  EXPECT_EQ(again->store->GetPool("p")->num_samples, 6);
}

TEST(DurableLogTest, AFailedCompactionIsCountedAndLeavesTheLog) {
  TempDir dir;
  WriteRecords(dir.path(), 2);
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  const int64_t before = d->log->file_bytes();
  const absl::Status failed =
      d->log->Rewrite([](DurableLog::Rewriter*) { return absl::UnavailableError("disk gone"); });
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(d->log->compaction_failures(), 1);
  EXPECT_EQ(d->log->last_compaction_error().message(), "disk gone");
  EXPECT_EQ(d->log->file_bytes(), before);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/rollpack.log.compact"));
  // The log goes on, and a later compaction succeeds.
  ASSERT_TRUE(d->store->Put("p", Samples(1, 77, "later-")).ok());
  EXPECT_TRUE(d->store->CompactLog().ok());
  EXPECT_EQ(d->log->compaction_failures(), 1);
}

TEST(DurableLogTest, ASecondCutAtTheSameOffsetKeepsTheFirst) {
  TempDir dir;
  const std::vector<int64_t> ends = WriteRecords(dir.path(), 2);
  const std::string path = dir.path() + "/rollpack.log";
  const std::string full = ReadFile(path);
  std::set<std::string> cut_files;
  for (int i = 0; i < 2; ++i) {
    WriteFile(path, full.substr(0, ends.back() - 5));  // the last record cut short, twice
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    cut_files.insert(d->info.cut_file);
  }
  EXPECT_EQ(cut_files.size(), 2u) << "each cut kept in a file of its own";
  for (const std::string& f : cut_files) EXPECT_TRUE(std::filesystem::exists(f)) << f;
}

TEST(DurableLogTest, AShortFileThatIsNotALogIsRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/rollpack.log";
  WriteFile(path, "hello");
  EXPECT_EQ(OpenDurable(dir.path()).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadFile(path), "hello");
  WriteFile(path, "RPLO");  // a crash while the header was written
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->info.torn_tail_bytes, 4);
}

TEST(DurableLogTest, AHalfWrittenCompactionIsRemovedAtStart) {
  TempDir dir;
  WriteRecords(dir.path(), 2);
  const std::string leftover = dir.path() + "/rollpack.log.compact";
  WriteFile(leftover, "RPLOG002 half a compaction");
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->info.removed_compaction_file);
  EXPECT_FALSE(std::filesystem::exists(leftover));
  EXPECT_EQ(d->store->GetPool("p")->num_samples, 4);
}

TEST(DurableLogTest, CorruptionBeforeTheTailIsRefused) {
  TempDir dir;
  const std::vector<int64_t> ends = WriteRecords(dir.path(), 3);
  const std::string path = dir.path() + "/rollpack.log";
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(ends[1] + 20);  // inside the first put record
  char c;
  f.seekg(ends[1] + 20);
  f.get(c);
  f.seekp(ends[1] + 20);
  f.put(static_cast<char>(c ^ 1));
  f.close();
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr("offset " + std::to_string(ends[1])));

  std::ofstream(path, std::ios::binary | std::ios::trunc) << "not a log at all";
  EXPECT_EQ(OpenDurable(dir.path()).status().code(), absl::StatusCode::kDataLoss);
}

// A full disk: RESOURCE_EXHAUSTED, nothing of the request stored, the store
// keeps serving, and the log holds exactly what was acknowledged.
void ExpectFullDiskRefusesCleanly(const std::string& dir) {
  std::vector<std::string> acknowledged;
  int refused = 0;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(d->store->RegisterModel("p", FromProto(Model())).ok());
    for (int i = 0; i < 400 && refused < 3; ++i) {
      std::vector<StoredSample> batch = Samples(2, 500 + i, "f" + std::to_string(i) + "-");
      const int64_t before = d->store->GetPool("p")->num_samples;
      absl::StatusOr<PutResult> put = d->store->Put("p", batch);
      if (put.ok()) {
        for (const StoredSample& s : batch) acknowledged.push_back(s.sample_id);
      } else {
        EXPECT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted) << put.status();
        EXPECT_THAT(put.status().message(), HasSubstr("disk full"));
        EXPECT_EQ(d->store->GetPool("p")->num_samples, before) << "a refused put stores nothing";
        ++refused;
      }
    }
    ASSERT_GE(refused, 1) << "the disk never filled";
    ASSERT_GE(acknowledged.size(), 2u);
    // Still serving: a step over what is stored works (a full disk refuses
    // its record, which is fine too; it must not crash or leak samples).
    absl::StatusOr<std::shared_ptr<const Step>> step =
        d->store->CreateStep("full", "p", {}, 2, SmallTopology());
    if (!step.ok()) {
      EXPECT_EQ(step.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_EQ(d->store->GetPool("p")->num_free_samples,
                static_cast<int64_t>(acknowledged.size()));
    }
  }
  absl::StatusOr<Durable> d = OpenDurable(dir);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->info.torn_tail_bytes, 0) << "failed writes are cut off, not left torn";
  EXPECT_EQ(d->store->GetPool("p")->num_samples, static_cast<int64_t>(acknowledged.size()));
  // Every acknowledged id is there (a step naming them all succeeds, unless
  // the refused "full" step above was durable and holds two of them).
  if (!d->store->GetStep("full").ok()) {
    absl::StatusOr<std::shared_ptr<const Step>> all =
        d->store->CreateStep("all", "p", acknowledged, 0, SmallTopology());
    EXPECT_TRUE(all.ok()) << all.status();
  }
}

TEST(DurableLogTest, FullTmpfsGivesResourceExhausted) {
  TempDir dir;
  const std::string mnt = dir.path() + "/small";
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (not root?); FileSizeLimit covers the same path";
  }
  ExpectFullDiskRefusesCleanly(mnt + "/data");
  EXPECT_EQ(umount(mnt.c_str()), 0);
}

TEST(DurableLogTest, FileSizeLimitGivesResourceExhausted) {
  // RLIMIT_FSIZE makes the kernel fail the write with EFBIG (SIGXFSZ
  // ignored): a full disk without needing root.
  TempDir dir;
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 200 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  ExpectFullDiskRefusesCleanly(dir.path() + "/data");
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
}

TEST(DurableLogTest, CompactionDropsReleasedStepsAndKeepsTheState) {
  TempDir dir;
  std::string fingerprint;
  int64_t peak = 0;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path(), /*compact_min_dead_bytes=*/64 << 10);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(d->store->RegisterModel("p", FromProto(Model())).ok());
    for (int round = 0; round < 6; ++round) {
      ASSERT_TRUE(d->store->Put("p", Samples(16, 40 + round, "c" + std::to_string(round) + "-")).ok());
      peak = std::max(peak, d->log->file_bytes());
      const std::string id = "step" + std::to_string(round);
      ASSERT_TRUE(d->store->CreateStep(id, "p", {}, 12, SmallTopology()).ok());
      if (round < 5) {
        ASSERT_TRUE(d->store->ReleaseStep(id).ok());
      }
    }
    EXPECT_GE(d->log->compactions(), 1);
    fingerprint = StepFingerprint(**d->store->GetStep("step5"));
    // The file holds the live records plus less dead data than the limits.
    const int64_t total_written = d->log->written();
    EXPECT_LT(d->log->file_bytes(), total_written - 64 * 1024)
        << "compaction shrinks the file; peak " << peak;
    EXPECT_LE(d->log->dead_bytes(), std::max<int64_t>(64 << 10, d->log->file_bytes() / 2));
  }
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  // 96 put, 60 released; step5 holds 12 of the remaining 36.
  EXPECT_EQ(d->store->GetPool("p")->num_samples, 36);
  EXPECT_EQ(d->store->GetPool("p")->num_free_samples, 24);
  for (int round = 0; round < 5; ++round) {
    EXPECT_FALSE(d->store->GetStep("step" + std::to_string(round)).ok());
  }
  absl::StatusOr<std::shared_ptr<const Step>> step5 = d->store->GetStep("step5");
  ASSERT_TRUE(step5.ok());
  EXPECT_EQ(StepFingerprint(**step5), fingerprint);
  // The free samples keep their arrival order across compaction: oldest first.
  // Steps took the oldest 72 of the 96 in arrival order; c4-8.. is next.
  Topology one = SmallTopology();
  one.dp = 1;
  absl::StatusOr<std::shared_ptr<const Step>> next = d->store->CreateStep("next", "p", {}, 1, one);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)->samples[0]->sample_id, "c4-rollout-8");
}

// Cluster holds (sample_store.h, "Cluster mode") are logged like steps: they
// come back after a restart (unconfirmed, so the member checks them against
// etcd again), through compaction too, and a dropped or released hold stays so.
TEST(DurableLogTest, ClusterHoldsComeBackUnconfirmedAndReleasesStayDone) {
  TempDir dir;
  std::vector<StoredSample> a = Samples(10, 3, "h-");
  auto ids = [&](std::initializer_list<int> which) {
    std::vector<std::string> out;
    for (int i : which) out.push_back(a[i].sample_id);
    return out;
  };
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(*d->store->RegisterModel("p", FromProto(Model())));
    ASSERT_TRUE(d->store->Put("p", a).ok());
    ASSERT_TRUE(d->store->Hold("h1", "p", ids({0, 1, 2}), "m:1", 11).ok());
    ASSERT_TRUE(d->store->ConfirmHold("h1").ok());
    ASSERT_TRUE(d->store->Hold("h2", "p", ids({3, 4}), "m:1", 12).ok());
    // Another attempt's drop leaves the hold alone.
    EXPECT_EQ(d->store->DropHold("h2", 99).status().code(), absl::StatusCode::kNotFound);
    ASSERT_TRUE(d->store->DropHold("h2", 12).ok());
    ASSERT_TRUE(d->store->Hold("h3", "p", ids({5}), "m:1", 13).ok());
    ASSERT_EQ(d->store->ReleaseStep("h3")->released_samples, 1);
    // All or nothing: a[0] is held, so a[7] stays free too.
    absl::Status refused = d->store->Hold("h4", "p", ids({7, 0}), "m:1", 14);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr(a[0].sample_id));
    ASSERT_TRUE(d->store->CompactLog().ok());
    ASSERT_TRUE(d->store->Hold("h5", "p", ids({6}), "m:2", 15).ok());
  }
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<PoolStats> pool = d->store->GetPool("p");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_samples, 9);
  EXPECT_EQ(pool->num_free_samples, 9 - 3 - 1);
  EXPECT_EQ(d->store->HoldIds(), (std::vector<std::string>{"h1", "h5"}));
  EXPECT_EQ(d->store->UnconfirmedHolds(absl::ZeroDuration()),
            (std::vector<std::string>{"h1", "h5"}));
  EXPECT_EQ(d->store->HoldAttempt("h1"), 11);
  EXPECT_EQ(d->store->HoldAttempt("h5"), 15);
  absl::StatusOr<std::vector<std::shared_ptr<const StoredSample>>> held =
      d->store->HeldSamples("h1", ids({2, 0}));
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(*(*held)[0] == a[2]);
  EXPECT_TRUE(*(*held)[1] == a[0]);
  EXPECT_EQ(d->store->HeldSamples("h1", ids({6})).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(d->store->DropHold("h1").ok());
  EXPECT_EQ(d->store->GetPool("p")->num_free_samples, 9 - 1);
  // Free again in arrival order: the oldest free sample is a[0] once more.
  absl::StatusOr<SampleStore::SampleListing> oldest = d->store->ListSamples("p", {}, 1);
  ASSERT_TRUE(oldest.ok());
  EXPECT_EQ(oldest->sample_ids, ids({0}));
}

}  // namespace
}  // namespace rollpack
