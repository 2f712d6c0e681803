#include "server/capture/base64.h"

#include <random>
#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using Decoder = absl::StatusOr<size_t> (*)(absl::string_view, absl::Span<char>);

struct Kernel {
  const char* name;
  Decoder decode;
};

class Base64Test : public ::testing::TestWithParam<Kernel> {
 protected:
  void SetUp() override {
    if (GetParam().decode == &base64_internal::DecodeAvx2 && !base64_internal::CpuHasAvx2()) {
      GTEST_SKIP() << "this CPU has no AVX2";
    }
  }

  absl::StatusOr<std::string> Decode(absl::string_view text) {
    std::string out(Base64DecodedSize(text), '\0');
    absl::StatusOr<size_t> n = GetParam().decode(text, absl::MakeSpan(out));
    if (!n.ok()) return n.status();
    out.resize(*n);
    return out;
  }
};

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

TEST_P(Base64Test, DecodesWhatAbseilEncodesAtEveryLength) {
  for (size_t n = 0; n < 300; ++n) {
    const std::string bytes = RandomBytes(n, n);
    const std::string text = absl::Base64Escape(bytes);
    ASSERT_EQ(Base64DecodedSize(text), n);
    absl::StatusOr<std::string> got = Decode(text);
    ASSERT_TRUE(got.ok()) << n << ": " << got.status();
    ASSERT_EQ(*got, bytes) << n;
  }
  // Megabytes, as routing payloads come, at lengths that end every way.
  for (size_t n : {size_t{3} << 20, (size_t{3} << 20) + 1, (size_t{3} << 20) + 2}) {
    const std::string bytes = RandomBytes(n, n);
    absl::StatusOr<std::string> got = Decode(absl::Base64Escape(bytes));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, bytes) << n;
  }
}

TEST_P(Base64Test, NamesTheFirstCharacterOutsideTheAlphabet) {
  const std::string text = absl::Base64Escape(RandomBytes(3000, 7));
  for (size_t at : {size_t{0}, size_t{5}, size_t{31}, size_t{32}, size_t{100}, size_t{1999},
                    text.size() - 5, text.size() - 1}) {
    for (char bad : {'-', '_', '\n', ' ', '"', '\x80', '\0', '='}) {
      std::string broken = text;
      broken[at] = bad;
      if (bad == '=' && at >= text.size() - 2) continue;  // padding is allowed there
      absl::StatusOr<std::string> got = Decode(broken);
      ASSERT_FALSE(got.ok()) << "offset " << at << " char " << int(bad);
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(got.status().message().find(absl::StrCat("offset ", at, " ")),
                absl::string_view::npos)
          << got.status();
    }
  }
}

TEST_P(Base64Test, RefusesMalformedEnds) {
  for (absl::string_view text : {"QUJD=", "QUI", "Q===", "QU=D", "=QUJ", "QUJ=QUJD", "QR=="}) {
    absl::StatusOr<std::string> got = Decode(text);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
  EXPECT_EQ(*Decode("QUI="), "AB");
  EXPECT_EQ(*Decode("QQ=="), "A");
  EXPECT_EQ(*Decode(""), "");
}

TEST_P(Base64Test, NeedsOnlyTheDecodedSizeOfRoom) {
  const std::string bytes = RandomBytes(24 * 1000, 3);
  const std::string text = absl::Base64Escape(bytes);
  std::string exact(bytes.size(), '\0');
  absl::StatusOr<size_t> n = GetParam().decode(text, absl::MakeSpan(exact));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(exact, bytes);
  std::string short_by_one(bytes.size() - 1, '\0');
  EXPECT_FALSE(GetParam().decode(text, absl::MakeSpan(short_by_one)).ok());
}

INSTANTIATE_TEST_SUITE_P(Kernels, Base64Test,
                         ::testing::Values(Kernel{"scalar", &base64_internal::DecodeScalar},
                                           Kernel{"avx2", &base64_internal::DecodeAvx2}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace rollpack
