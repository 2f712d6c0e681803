#include "server/ops/h2_token_check.h"

#include <nghttp2/nghttp2.h>

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

const char kTokens[] =
    "producer producer-token-0123456789\n"
    "admin admin-token-0123456789ab\n";

// A client's HPACK encoder, as gRPC's would encode a call's headers (with
// its dynamic table: the check must decode every block to follow it).
class Encoder {
 public:
  Encoder() { nghttp2_hd_deflate_new(&deflater_, 4096); }
  ~Encoder() { nghttp2_hd_deflate_del(deflater_); }

  std::string Call(const std::string& path, const std::string& authorization) {
    std::vector<std::pair<std::string, std::string>> headers = {
        {":method", "POST"}, {":scheme", "http"}, {":path", path},
        {":authority", "127.0.0.1"}, {"content-type", "application/grpc"}, {"te", "trailers"}};
    if (!authorization.empty()) headers.push_back({"authorization", authorization});
    std::vector<nghttp2_nv> nva;
    for (auto& [name, value] : headers) {
      nva.push_back({reinterpret_cast<uint8_t*>(name.data()),
                     reinterpret_cast<uint8_t*>(value.data()), name.size(), value.size(),
                     NGHTTP2_NV_FLAG_NONE});
    }
    std::string out(nghttp2_hd_deflate_bound(deflater_, nva.data(), nva.size()), '\0');
    const ssize_t n = nghttp2_hd_deflate_hd(deflater_, reinterpret_cast<uint8_t*>(out.data()),
                                            out.size(), nva.data(), nva.size());
    out.resize(n < 0 ? 0 : static_cast<size_t>(n));
    return out;
  }

 private:
  nghttp2_hd_deflater* deflater_ = nullptr;
};

class H2TokenCheckTest : public ::testing::Test {
 protected:
  H2TokenCheckTest() : auth_(*Authorizer::Parse(kTokens)), check_(&auth_) {}

  Authorizer auth_;
  H2TokenCheck check_;
  Encoder client_;
};

TEST_F(H2TokenCheckTest, CallsWithAValidTokenSendAsMuchAsTheyLike) {
  for (uint32_t stream = 1; stream < 40; stream += 2) {
    ASSERT_TRUE(check_.OnHeaderBlock(stream,
                                     client_.Call("/rollpack.v1.Rollouts/PutSamples",
                                                  "Bearer producer-token-0123456789"),
                                     false)
                    .ok());
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(check_.OnData(stream, 16384, false).ok());
  }
}

TEST_F(H2TokenCheckTest, RefusedCallsMaySendOnlyAMegabyteAtOnce) {
  // A role that may not call the method is refused like a missing token.
  ASSERT_TRUE(check_.OnHeaderBlock(1,
                                   client_.Call("/rollpack.v1.Scheduler/ReleaseStep",
                                                "Bearer producer-token-0123456789"),
                                   false)
                  .ok());
  ASSERT_TRUE(
      check_.OnHeaderBlock(3, client_.Call("/rollpack.v1.Rollouts/GetPool", ""), false).ok());
  for (int i = 0; i < 32; ++i) ASSERT_TRUE(check_.OnData(1, 16384, false).ok());
  for (int i = 0; i < 31; ++i) ASSERT_TRUE(check_.OnData(3, 16384, false).ok());
  absl::Status status = check_.OnData(3, 16384 + 1, false);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_NE(status.message().find("1048577"), absl::string_view::npos) << status;
}

TEST_F(H2TokenCheckTest, AnEndedRefusedCallNoLongerCounts) {
  for (uint32_t stream = 1; stream < 400; stream += 2) {
    ASSERT_TRUE(
        check_.OnHeaderBlock(stream, client_.Call("/rollpack.v1.Rollouts/GetPool", ""), false)
            .ok());
    ASSERT_TRUE(check_.OnData(stream, 100000, true).ok()) << stream;
  }
  // Refused calls without a body (END_STREAM on HEADERS) hold nothing.
  for (uint32_t stream = 401; stream < 401 + 2 * 5000; stream += 2) {
    ASSERT_TRUE(
        check_.OnHeaderBlock(stream, client_.Call("/rollpack.v1.Rollouts/GetPool", ""), true)
            .ok());
  }
}

TEST_F(H2TokenCheckTest, ARefusedCallTheServerEndedNoLongerCounts) {
  // A client-streaming call answered UNAUTHENTICATED (trailers, then
  // RST_STREAM) whose client never sends END_STREAM.
  for (uint32_t stream = 1; stream < 40; stream += 2) {
    ASSERT_TRUE(
        check_.OnHeaderBlock(stream, client_.Call("/rollpack.v1.Rollouts/PutSamples", ""), false)
            .ok());
    ASSERT_TRUE(check_.OnData(stream, 600000, false).ok()) << stream;
    check_.OnStreamEnded(stream);
  }
}

TEST_F(H2TokenCheckTest, TooManyOpenRefusedCallsCloseTheConnection) {
  absl::Status status;
  uint32_t stream = 1;
  for (size_t i = 0; i <= H2TokenCheck::kMaxRefusedCalls && status.ok(); ++i, stream += 2) {
    status = check_.OnHeaderBlock(stream, client_.Call("/rollpack.v1.Rollouts/GetPool", ""), false);
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
}

TEST_F(H2TokenCheckTest, OpenMethodsNeedNoToken) {
  ASSERT_TRUE(
      check_.OnHeaderBlock(1, client_.Call("/grpc.health.v1.Health/Check", ""), false).ok());
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(check_.OnData(1, 16384, false).ok());
}

TEST_F(H2TokenCheckTest, AHeaderBlockThatDoesNotDecodeIsRefused) {
  absl::Status status = check_.OnHeaderBlock(1, std::string("\xff\xff\xff\xff\xff\xff", 6), false);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

}  // namespace
}  // namespace rollpack
