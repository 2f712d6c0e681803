#include "server/ops/h2_open_streams.h"

#include "gtest/gtest.h"

namespace rollpack {
namespace {

TEST(H2OpenStreamsTest, AStreamIsOpenUntilTheServerEndsIt) {
  H2OpenStreams streams;
  streams.Opened(1);
  streams.Opened(3);
  EXPECT_TRUE(streams.MayBeOpen(1));
  streams.Ended(1);
  EXPECT_FALSE(streams.MayBeOpen(1)) << "answered: resetting it throws nothing away";
  EXPECT_TRUE(streams.MayBeOpen(3));
}

TEST(H2OpenStreamsTest, WhatTheClientHasNotOpenedCounts) {
  H2OpenStreams streams;
  EXPECT_TRUE(streams.MayBeOpen(1)) << "idle";
  streams.Opened(5);
  streams.Ended(7);  // not opened: ignored
  EXPECT_TRUE(streams.MayBeOpen(7));
  EXPECT_TRUE(streams.MayBeOpen(0));
  EXPECT_TRUE(streams.MayBeOpen(2)) << "an even id is the server's";
  EXPECT_FALSE(streams.MayBeOpen(1)) << "skipped ids are closed (RFC 9113 5.1.1)";
  EXPECT_FALSE(streams.MayBeOpen(3));
}

TEST(H2OpenStreamsTest, ALongLivedStreamStaysOpenBesideManyShortOnes) {
  H2OpenStreams streams;
  streams.Opened(1);  // a trainer's stream, never ended here
  for (uint32_t id = 3; id < 3 + 2 * 10 * H2OpenStreams::kWindow; id += 2) {
    streams.Opened(id);
    streams.Ended(id);
  }
  EXPECT_TRUE(streams.MayBeOpen(1));
  EXPECT_FALSE(streams.MayBeOpen(3)) << "an old answered stream is still known as ended";
  EXPECT_FALSE(streams.MayBeOpen(2 * 5 * H2OpenStreams::kWindow + 1));
  streams.Ended(1);
  EXPECT_FALSE(streams.MayBeOpen(1));
}

TEST(H2OpenStreamsTest, TooManyOldOpenStreamsAreForgottenAsOpen) {
  H2OpenStreams streams;
  const uint32_t old_open = H2OpenStreams::kMaxOldOpen + 10;
  for (uint32_t i = 0; i < old_open; ++i) streams.Opened(2 * i + 1);  // all left open
  const uint32_t first_ended = 2 * old_open + 1;
  for (uint32_t id = first_ended; id < first_ended + 4 * H2OpenStreams::kWindow; id += 2) {
    streams.Opened(id);
    streams.Ended(id);
  }
  // The 10 oldest were forgotten, and so were the ended ids below them:
  // both count as open, never the reverse.
  for (uint32_t i = 0; i < old_open; ++i) EXPECT_TRUE(streams.MayBeOpen(2 * i + 1)) << i;
  EXPECT_FALSE(streams.MayBeOpen(first_ended));
  for (uint32_t i = 10; i < old_open; ++i) streams.Ended(2 * i + 1);
  EXPECT_FALSE(streams.MayBeOpen(2 * 10 + 1)) << "still followed";
  EXPECT_TRUE(streams.MayBeOpen(2 * 9 + 1)) << "forgotten";
}

TEST(H2OpenStreamsTest, AJumpPastTheWindowKeepsWhatIsOpen) {
  H2OpenStreams streams;
  for (uint32_t id = 1; id <= 21; id += 2) streams.Opened(id);
  for (uint32_t id = 1; id <= 21; id += 4) streams.Ended(id);  // 1, 5, ..., 21
  streams.Opened(1'000'001);
  for (uint32_t id = 1; id <= 21; id += 2) {
    EXPECT_EQ(streams.MayBeOpen(id), id % 4 == 3) << id;
  }
  EXPECT_FALSE(streams.MayBeOpen(999'999)) << "skipped";
  EXPECT_TRUE(streams.MayBeOpen(1'000'001));
  streams.Opened(0x7fffffff);  // the highest id: no overflow
  EXPECT_TRUE(streams.MayBeOpen(0x7fffffff));
  EXPECT_TRUE(streams.MayBeOpen(1'000'001));
}

}  // namespace
}  // namespace rollpack
