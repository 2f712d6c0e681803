#include "server/ops/h2_frame_watch.h"

#include <string>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

const std::string kPreface("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  const uint32_t n = static_cast<uint32_t>(payload.size());
  f += static_cast<char>(n >> 16);
  f += static_cast<char>(n >> 8);
  f += static_cast<char>(n);
  f += static_cast<char>(type);
  f += static_cast<char>(flags);
  for (int shift = 24; shift >= 0; shift -= 8) f += static_cast<char>(stream >> shift);
  return f + payload;
}

std::string Headers(uint32_t stream, bool end_headers = true, size_t size = 10) {
  return Frame(0x1, end_headers ? 0x4 : 0, stream, std::string(size, 'h'));
}
std::string Reset(uint32_t stream) { return Frame(0x3, 0, stream, std::string(4, '\0')); }
std::string Data(uint32_t stream, size_t size) {
  return Frame(0x0, 0, stream, std::string(size, 'd'));
}

TEST(H2FrameWatchTest, CountsOpenedAndResetStreamsWhateverTheChunking) {
  std::string bytes = kPreface + Frame(0x4, 0, 0, std::string(12, 's'));  // SETTINGS
  for (uint32_t id = 1; id <= 199; id += 2) bytes += Headers(id) + Data(id, 100) + Reset(id);
  bytes += Headers(3);  // trailers-like HEADERS on an old stream: not a new one
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{9}, size_t{4096}, bytes.size()}) {
    H2FrameWatch watch(H2FrameWatch::Direction::kFromClient);
    H2FrameTally total;
    for (size_t at = 0; at < bytes.size(); at += chunk) {
      absl::StatusOr<H2FrameTally> t = watch.Feed(absl::string_view(bytes).substr(at, chunk));
      ASSERT_TRUE(t.ok()) << t.status();
      total.streams_opened += t->streams_opened;
      total.streams_reset += t->streams_reset;
    }
    EXPECT_EQ(total.streams_opened, 100) << "chunk " << chunk;
    EXPECT_EQ(total.streams_reset, 100) << "chunk " << chunk;
    EXPECT_EQ(watch.highest_stream_id(), 199u);
    EXPECT_TRUE(watch.at_frame_boundary());
  }
}

TEST(H2FrameWatchTest, KnowsWhetherItStandsBetweenFrames) {
  H2FrameWatch watch(H2FrameWatch::Direction::kFromServer);
  EXPECT_TRUE(watch.at_frame_boundary());
  const std::string frame = Data(1, 50);
  ASSERT_TRUE(watch.Feed(frame.substr(0, 5)).ok());
  EXPECT_FALSE(watch.at_frame_boundary());
  ASSERT_TRUE(watch.Feed(frame.substr(5, 20)).ok());
  EXPECT_FALSE(watch.at_frame_boundary());
  ASSERT_TRUE(watch.Feed(frame.substr(25)).ok());
  EXPECT_TRUE(watch.at_frame_boundary());
}

TEST(H2FrameWatchTest, RefusesWhatIsNotHttp2) {
  H2FrameWatch watch(H2FrameWatch::Direction::kFromClient);
  absl::StatusOr<H2FrameTally> t = watch.Feed("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_FALSE(watch.Feed(kPreface).ok()) << "a failed watch stays failed";
}

TEST(H2FrameWatchTest, RefusesAContinuationFlood) {
  H2FrameWatch watch(H2FrameWatch::Direction::kFromClient, /*max_header_block_bytes=*/1000);
  ASSERT_TRUE(watch.Feed(kPreface + Headers(1, /*end_headers=*/false, 400)).ok());
  ASSERT_TRUE(watch.Feed(Frame(0x9, 0, 1, std::string(400, 'c'))).ok());
  absl::StatusOr<H2FrameTally> t = watch.Feed(Frame(0x9, 0, 1, std::string(400, 'c')));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
  EXPECT_NE(t.status().message().find("1200 bytes"), absl::string_view::npos) << t.status();
}

TEST(H2FrameWatchTest, EndedHeaderBlocksDoNotAddUp) {
  H2FrameWatch watch(H2FrameWatch::Direction::kFromClient, /*max_header_block_bytes=*/1000);
  ASSERT_TRUE(watch.Feed(kPreface).ok());
  for (uint32_t id = 1; id < 100; id += 2) {
    ASSERT_TRUE(watch.Feed(Headers(id, /*end_headers=*/false, 600)).ok());
    ASSERT_TRUE(watch.Feed(Frame(0x9, 0x4, id, std::string(300, 'c'))).ok());
  }
}

TEST(H2FrameWatchTest, AFrameInsideAClientHeaderBlockIsRefused) {
  H2FrameWatch watch(H2FrameWatch::Direction::kFromClient);
  ASSERT_TRUE(watch.Feed(kPreface + Headers(1, /*end_headers=*/false, 100)).ok());
  absl::StatusOr<H2FrameTally> t = watch.Feed(Data(1, 10));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
}

TEST(H2FrameWatchTest, TheServersHeaderBlocksAreNotBounded) {
  // gRPC's own responses are not the client's doing.
  H2FrameWatch watch(H2FrameWatch::Direction::kFromServer, /*max_header_block_bytes=*/100);
  ASSERT_TRUE(watch.Feed(Headers(1, /*end_headers=*/false, 1000)).ok());
  ASSERT_TRUE(watch.Feed(Frame(0x9, 0x4, 1, std::string(1000, 'c'))).ok());
}

TEST(H2FrameWatchTest, GoawayIsAWellFormedFrame) {
  const std::string goaway = EnhanceYourCalmGoaway(77, "too many resets");
  H2FrameWatch watch(H2FrameWatch::Direction::kFromServer);
  ASSERT_TRUE(watch.Feed(goaway).ok());
  EXPECT_TRUE(watch.at_frame_boundary());
  ASSERT_EQ(goaway.size(), 9u + 8u + 15u);
  EXPECT_EQ(goaway[3], 0x7);                    // GOAWAY
  EXPECT_EQ(goaway.substr(5, 4), std::string(4, '\0'));  // stream 0
  EXPECT_EQ(static_cast<uint8_t>(goaway[12]), 77);     // last stream id
  EXPECT_EQ(static_cast<uint8_t>(goaway[16]), 0xb);    // ENHANCE_YOUR_CALM
  EXPECT_EQ(goaway.substr(17), "too many resets");
}

TEST(H2FrameWatchTest, ProtocolErrorGoawayNamesNoStream) {
  const std::string goaway = ProtocolErrorGoaway("not HTTP/2");
  H2FrameWatch watch(H2FrameWatch::Direction::kFromServer);
  ASSERT_TRUE(watch.Feed(goaway).ok());
  ASSERT_EQ(goaway.size(), 9u + 8u + 10u);
  EXPECT_EQ(goaway[3], 0x7);                                // GOAWAY
  EXPECT_EQ(goaway.substr(9, 4), std::string(4, '\0'));    // last stream id 0
  EXPECT_EQ(goaway.substr(13, 4), std::string("\0\0\0\x01", 4));  // PROTOCOL_ERROR
  EXPECT_EQ(goaway.substr(17), "not HTTP/2");
}

// Feeds `bytes` in chunks of `chunk` bytes; the tallies added up.
H2FrameTally FeedInChunks(H2FrameWatch& watch, const std::string& bytes, size_t chunk) {
  H2FrameTally total;
  for (size_t at = 0; at < bytes.size(); at += chunk) {
    absl::StatusOr<H2FrameTally> t = watch.Feed(absl::string_view(bytes).substr(at, chunk));
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) break;
    total.streams_opened += t->streams_opened;
    total.streams_reset += t->streams_reset;
    total.resets_of_ended_streams += t->resets_of_ended_streams;
  }
  return total;
}

TEST(H2FrameWatchTest, ResetsOfStreamsTheServerEndedAreToldApart) {
  for (size_t chunk : {size_t{1}, size_t{5}, size_t{4096}}) {
    H2OpenStreams streams;
    H2FrameWatch from_client(H2FrameWatch::Direction::kFromClient,
                             H2FrameWatch::kDefaultMaxHeaderBlockBytes, nullptr, &streams);
    H2FrameWatch from_server(H2FrameWatch::Direction::kFromServer,
                             H2FrameWatch::kDefaultMaxHeaderBlockBytes, nullptr, &streams);
    const std::string settings = Frame(0x4, 0, 0, std::string(12, 's'));
    FeedInChunks(from_client, kPreface + settings + Headers(1) + Headers(3) + Headers(5) +
                                  Headers(7),
                 chunk);
    // Stream 1 answered (headers, a message, trailers with END_STREAM: 0x5),
    // 3 only begun (headers, a message), 5 reset by the server, 7 silent.
    FeedInChunks(from_server,
                 settings + Headers(1) + Data(1, 40) + Frame(0x1, 0x5, 1, "trailers") +
                     Headers(3) + Data(3, 40) + Reset(5),
                 chunk);
    H2FrameTally t = FeedInChunks(from_client, Reset(1) + Reset(3) + Reset(5) + Reset(7), chunk);
    EXPECT_EQ(t.resets_of_ended_streams, 2) << "1 and 5, chunk " << chunk;
    EXPECT_EQ(t.streams_reset, 2) << "3 and 7: the server is still at them, chunk " << chunk;
    t = FeedInChunks(from_client, Reset(3) + Reset(9), chunk);
    EXPECT_EQ(t.resets_of_ended_streams, 1) << "3 again: the client ended it already";
    EXPECT_EQ(t.streams_reset, 1) << "9: never opened";
  }
}

TEST(H2FrameWatchTest, AnEndOfStreamOnDataEndsTheStreamToo) {
  H2OpenStreams streams;
  H2FrameWatch from_client(H2FrameWatch::Direction::kFromClient,
                           H2FrameWatch::kDefaultMaxHeaderBlockBytes, nullptr, &streams);
  H2FrameWatch from_server(H2FrameWatch::Direction::kFromServer,
                           H2FrameWatch::kDefaultMaxHeaderBlockBytes, nullptr, &streams);
  ASSERT_TRUE(from_client.Feed(kPreface + Headers(1) + Headers(3)).ok());
  ASSERT_TRUE(from_server.Feed(Headers(1) + Frame(0x0, 0x1, 1, "last") + Data(3, 4)).ok());
  absl::StatusOr<H2FrameTally> t = from_client.Feed(Reset(1) + Reset(3));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->resets_of_ended_streams, 1);
  EXPECT_EQ(t->streams_reset, 1);
}

}  // namespace
}  // namespace rollpack
