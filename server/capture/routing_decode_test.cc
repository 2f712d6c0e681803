#include "server/capture/routing_decode.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/capture/base64.h"
#include "server/capture/capture_test_support.h"
#include "server/capture/npy_header.h"
#include "server/capture/routing_rows.h"
#include "server/capture/sglang_routing.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// A .npy file of `descr` and `shape` whose header (magic to newline) is
// `header_bytes` long (any length, so that the data starts at every place
// of a base64 group), then `data`.
std::string Npy(const std::string& descr, const std::string& shape, size_t header_bytes,
                const std::string& data, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string dict =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': ", shape, ", }");
  while (prefix + dict.size() + 1 < header_bytes) dict += ' ';
  dict += '\n';
  std::string file("\x93NUMPY", 6);
  file += static_cast<char>(major);
  file += '\0';
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) {
    file += static_cast<char>((dict.size() >> (8 * i)) & 0xff);
  }
  return file + dict + data;
}

// Bytes 0, 1, 2, ... (distinct within a group for any K <= 256).
std::string Bytes(size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(i * 7 + i / 251);
  return out;
}

// What the capture did before decoding straight into the array: all of
// the file into a buffer, parsed, copied or converted out.
absl::StatusOr<v1::NDArray> ThroughBuffer(absl::string_view base64) {
  std::string file;
  if (absl::Status s = DecodeBase64Into(base64, file); !s.ok()) return s;
  absl::StatusOr<NpyArray> npy = ParseNpy(file);
  if (!npy.ok()) return npy.status();
  return RoutingNdArray(*npy);
}

void ExpectSame(absl::string_view base64, const std::string& what) {
  const absl::StatusOr<v1::NDArray> want = ThroughBuffer(base64);
  const absl::StatusOr<v1::NDArray> got = DecodeNpyRouting(base64);
  ASSERT_EQ(got.status(), want.status()) << what;
  if (!want.ok()) return;
  EXPECT_EQ(got->dtype(), want->dtype()) << what;
  EXPECT_EQ(std::vector<int64_t>(got->shape().begin(), got->shape().end()),
            std::vector<int64_t>(want->shape().begin(), want->shape().end()))
      << what;
  EXPECT_TRUE(got->data() == want->data()) << what;
}

TEST(DecodeNpyRoutingTest, EqualsTheBufferedDecodeForEveryDtypeAndAlignment) {
  struct Dtype {
    const char* descr;
    int bytes;
    v1::DType kept;
  };
  const Dtype dtypes[] = {{"|u1", 1, v1::UINT8},  {"<u1", 1, v1::UINT8}, {"<u2", 2, v1::UINT16},
                          {"<i2", 2, v1::INT16},  {"<i4", 4, v1::INT32}, {"|i1", 1, v1::INT16},
                          {"<i8", 8, v1::INT32}, {"<u4", 4, v1::INT32}};
  for (const Dtype& d : dtypes) {
    for (int major : {1, 2}) {
      // Headers ending at each place of a 3-byte group, and data ending at
      // each (no, one or two '=').
      for (size_t header_bytes : {128, 129, 130, 192}) {
        for (int rows : {1, 2, 3, 5, 100}) {
          const std::string data = Bytes(static_cast<size_t>(rows) * 3 * 4 * d.bytes);
          const std::string file =
              Npy(d.descr, absl::StrCat("(", rows, ", 3, 4)"), header_bytes, data, major);
          const std::string what =
              absl::StrCat(d.descr, " v", major, " header ", header_bytes, " rows ", rows);
          ExpectSame(absl::Base64Escape(file), what);
          absl::StatusOr<v1::NDArray> got = DecodeNpyRouting(absl::Base64Escape(file));
          if (got.ok()) {
            EXPECT_EQ(got->dtype(), d.kept) << what;
            if (d.bytes != 8 && std::string(d.descr) != "|i1") {
              EXPECT_TRUE(got->data() == data);
            }
          }
        }
      }
    }
  }
}

TEST(DecodeNpyRoutingTest, RefusesWithTheBufferedDecodesMessages) {
  const std::string data = Bytes(5 * 3 * 4 * 2);
  const std::string file = Npy("<i2", "(5, 3, 4)", 128, data);
  const std::string good = absl::Base64Escape(file);
  std::vector<std::pair<std::string, std::string>> cases = {
      {"a character outside the alphabet in the data", good.substr(0, 200) + "*" +
                                                           good.substr(201)},
      {"one in the header", good.substr(0, 40) + "!" + good.substr(41)},
      {"'=' inside", good.substr(0, 180) + "=" + good.substr(181)},
      {"a length that is not a multiple of 4", good.substr(0, good.size() - 1)},
      {"fewer data bytes than the shape", absl::Base64Escape(file.substr(0, file.size() - 6))},
      {"more", absl::Base64Escape(file + "xyz")},
      {"a header cut short", absl::Base64Escape(file.substr(0, 60))},
      {"no magic", absl::Base64Escape("NUMPY" + file)},
      {"version 9", absl::Base64Escape(file.substr(0, 6) + "\x09" + file.substr(7))},
      {"a float dtype", absl::Base64Escape(Npy("<f4", "(5, 3, 4)", 128, Bytes(240)))},
      {"an int64 id past int32", absl::Base64Escape(Npy("<i8", "(1, 1, 1)", 128,
                                                        std::string("\0\0\0\0\1\0\0\0", 8)))},
      {"nothing", ""},
      {"only the preamble", good.substr(0, 16)},
  };
  for (const auto& [what, base64] : cases) {
    EXPECT_FALSE(DecodeNpyRouting(base64).ok()) << what;
    ExpectSame(base64, what);
  }
  EXPECT_THAT(std::string(DecodeNpyRouting(cases[0].second).status().message()),
              HasSubstr("not base64 at offset 200"));
}

TEST(DecodeSglangRoutingTest, KeepsOrConvertsTheEnginesDtype) {
  const ModelSpec model = MoeModel(2, 300, 2);
  // 4 tokens: rows [0, 3) of 2 layers of top-2.
  std::vector<int16_t> ids16(3 * 2 * 2);
  for (size_t i = 0; i < ids16.size(); ++i) ids16[i] = static_cast<int16_t>(i * 20);
  const std::string raw16(reinterpret_cast<const char*>(ids16.data()), ids16.size() * 2);
  absl::StatusOr<DecodedRouting> kept =
      DecodeSglangRouting(absl::Base64Escape(raw16), "int16", 4, model, 0);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->array.dtype(), v1::INT16);
  EXPECT_EQ(kept->array.shape_size(), 3);
  EXPECT_EQ(kept->array.shape(0), 3);
  EXPECT_TRUE(kept->array.data() == raw16);
  EXPECT_EQ(kept->row_offset, 0);

  std::vector<int64_t> ids64(ids16.begin(), ids16.end());
  const std::string raw64(reinterpret_cast<const char*>(ids64.data()), ids64.size() * 8);
  absl::StatusOr<DecodedRouting> narrowed =
      DecodeSglangRouting(absl::Base64Escape(raw64), "torch.int64", 4, model, 0);
  ASSERT_TRUE(narrowed.ok()) << narrowed.status();
  EXPECT_EQ(narrowed->array.dtype(), v1::INT32);
  EXPECT_EQ(narrowed->array.data().size(), ids16.size() * 4);

  // int32 when unnamed; 12 values do not fill a whole row of another
  // shape, and the dtype's name is checked as before.
  std::vector<int32_t> ids32(ids16.begin(), ids16.end());
  const std::string raw32(reinterpret_cast<const char*>(ids32.data()), ids32.size() * 4);
  absl::StatusOr<DecodedRouting> plain =
      DecodeSglangRouting(absl::Base64Escape(raw32), "", 4, model, 0);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->array.dtype(), v1::INT32);
  EXPECT_THAT(std::string(DecodeSglangRouting(absl::Base64Escape(raw32), "", 9, model, 0)
                              .status()
                              .message()),
              HasSubstr("SGLang routed_experts holds 12 <i4 values"));
  EXPECT_THAT(std::string(DecodeSglangRouting(absl::Base64Escape(raw32), "float32", 4, model, 0)
                              .status()
                              .message()),
              HasSubstr("\"float32\" is not an integer dtype"));
  EXPECT_THAT(std::string(DecodeSglangRouting("abc", "", 4, model, 0).status().message()),
              HasSubstr("not base64"));
}

}  // namespace
}  // namespace rollpack
