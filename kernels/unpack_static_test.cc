// CPU static unpack (unpack_static.h) against references written
// differently: the rows the micro-batch has must equal Unpack's per-layer
// output read through the buffer's strides; the rows past it must be the
// filler, K distinct in-range ids per (row, layer), checked as sets here and
// against layout.md's formula written out longhand.
#include "kernels/unpack_static.h"

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/unpack.h"

namespace rollpack::kernels {
namespace {

struct Case {
  int64_t rows, max_rows, layers;
  int k, e;
  bool u16, i32, fill;
  int layout;  // 0 contiguous, 1 slice of a wider row-major buffer, 2 layer-major
};

// Runs StaticUnpack on a poisoned buffer and checks every element of it.
void CheckCase(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE("rows=" + std::to_string(c.rows) + " max_rows=" + std::to_string(c.max_rows) +
               " layers=" + std::to_string(c.layers) + " K=" + std::to_string(c.k) +
               " E=" + std::to_string(c.e) + " layout=" + std::to_string(c.layout));
  const int64_t n_in = c.rows * c.layers * c.k;
  std::vector<uint8_t> in8(n_in);
  std::vector<uint16_t> in16(n_in);
  for (int64_t i = 0; i < n_in; ++i) {
    in16[i] = uint16_t(rng() % uint64_t(c.e));
    in8[i] = uint8_t(in16[i] & 0xff);
  }
  std::vector<uint8_t> mask(c.rows);
  for (auto& m : mask) m = uint8_t(rng() % 4 != 0);

  // Strides of the three layouts; a wider buffer leaves gaps that must stay
  // untouched.
  int64_t rs = -1, ls = -1, total = c.max_rows * c.layers * c.k;
  if (c.layout == 1) {  // [max_rows, layers + 3, K + 2][:, 1:, :K]
    ls = c.k + 2;
    rs = (c.layers + 3) * ls;
    total = c.max_rows * rs + ls;
  } else if (c.layout == 2) {  // [layers, max_rows + 1, K]
    rs = c.k;
    ls = (c.max_rows + 1) * c.k;
    total = c.layers * ls;
  }
  const int64_t base = c.layout == 1 ? ls : 0;
  const int64_t poison = 0x5a5a5a5a;
  std::vector<int64_t> out64(total + 1, poison);
  std::vector<int32_t> out32(total + 1, int32_t(poison));

  StaticUnpackArgs a;
  a.experts = c.u16 ? static_cast<const void*>(in16.data()) : in8.data();
  a.in_type = c.u16 ? IndexType::kU16 : IndexType::kU8;
  a.mask = mask.data();
  a.rows = c.rows;
  a.layers = c.layers;
  a.k = c.k;
  a.num_experts = c.e;
  a.out = c.i32 ? static_cast<void*>(out32.data() + base) : out64.data() + base;
  a.out_type = c.i32 ? OutIndexType::kI32 : OutIndexType::kI64;
  a.max_rows = c.max_rows;
  a.out_row_stride = rs;
  a.out_layer_stride = ls;
  a.masked_fill_minus_one = c.fill;
  ASSERT_TRUE(cpu::StaticUnpack(a).ok()) << cpu::StaticUnpack(a).ToString();

  // Reference for the micro-batch's rows: Unpack into [layers, rows, K].
  std::vector<int64_t> ref(std::max<int64_t>(n_in, 1));
  UnpackArgs u;
  u.experts = a.experts;
  u.in_type = a.in_type;
  u.mask = mask.data();
  u.rows = c.rows;
  u.layers = c.layers;
  u.k = c.k;
  u.out = ref.data();
  u.masked_fill_minus_one = c.fill;
  ASSERT_TRUE(cpu::Unpack(u).ok());

  const int64_t RS = rs == -1 ? c.layers * c.k : rs, LS = ls == -1 ? c.k : ls;
  std::vector<char> written(total + 1, 0);
  auto got = [&](int64_t off) { return c.i32 ? int64_t(out32[base + off]) : out64[base + off]; };
  for (int64_t r = 0; r < c.max_rows; ++r) {
    for (int64_t l = 0; l < c.layers; ++l) {
      std::set<int64_t> ids;
      for (int j = 0; j < c.k; ++j) {
        const int64_t off = r * RS + l * LS + j;
        written[base + off] = 1;
        const int64_t v = got(off);
        if (r < c.rows) {
          ASSERT_EQ(v, ref[(l * c.rows + r) * c.k + j]) << "row " << r << " layer " << l;
        } else {
          // (q * K + j) mod E with q = r, longhand.
          ASSERT_EQ(v, (r * c.k + j) % c.e) << "filler row " << r << " layer " << l;
          ASSERT_GE(v, 0);
          ASSERT_LT(v, c.e);
          ids.insert(v);
        }
      }
      if (r >= c.rows) {
        ASSERT_EQ(int64_t(ids.size()), c.k) << "filler ids not distinct, row " << r;
      }
    }
  }
  for (int64_t i = 0; i <= total; ++i) {
    if (written[i]) continue;
    const int64_t v = c.i32 ? int64_t(out32[i]) : out64[i];
    ASSERT_EQ(v, c.i32 ? int64_t(int32_t(poison)) : poison) << "wrote outside the view at " << i;
  }
}

TEST(StaticUnpack, MatchesUnpackAndFillsTheRest) {
  std::mt19937_64 rng(2026);
  int n = 0;
  for (int layout = 0; layout < 3; ++layout) {
    for (bool u16 : {false, true}) {
      for (bool i32 : {false, true}) {
        for (bool fill : {false, true}) {
          for (int t = 0; t < 6; ++t) {
            Case c;
            c.k = 1 + int(rng() % 16);
            c.e = c.k + int(rng() % (u16 ? 1000 - c.k : 256 - c.k));
            c.layers = 1 + int64_t(rng() % 7);
            c.max_rows = int64_t(rng() % 60);
            c.rows = t == 0 ? c.max_rows : (t == 1 ? 0 : int64_t(rng() % (c.max_rows + 1)));
            c.u16 = u16;
            c.i32 = i32;
            c.fill = fill;
            c.layout = layout;
            CheckCase(c, rng);
            ++n;
          }
        }
      }
    }
  }
  EXPECT_EQ(n, 144);
}

TEST(StaticUnpack, FillerIsNeverAConstantRowEvenWithKEqualsE) {
  std::mt19937_64 rng(1);
  CheckCase({0, 40, 3, 8, 8, false, false, false, 0}, rng);
  CheckCase({5, 300, 2, 1, 1, false, false, false, 0}, rng);  // E = K = 1: the only valid row
  CheckCase({3, 70, 4, 6, 64, true, false, false, 0}, rng);
}

TEST(StaticUnpack, RowsFromPointer) {
  // rows_ptr replaces rows (clamped to [0, max_rows]); experts then hold
  // max_rows rows, of which only the first *rows_ptr are read.
  const int layers = 2, k = 2, e = 16, max_rows = 5;
  std::vector<uint8_t> in(max_rows * layers * k);
  for (size_t i = 0; i < in.size(); ++i) in[i] = uint8_t(i % e);
  std::vector<int64_t> out(max_rows * layers * k, -7);
  StaticUnpackArgs a;
  a.experts = in.data();
  a.layers = layers;
  a.k = k;
  a.num_experts = e;
  a.out = out.data();
  a.max_rows = max_rows;
  a.rows = 99;  // ignored with rows_ptr
  for (int64_t rows : {int64_t{3}, int64_t{-4}, int64_t{1000}}) {
    a.rows_ptr = &rows;
    ASSERT_TRUE(cpu::StaticUnpack(a).ok());
    const int64_t eff = rows < 0 ? 0 : (rows > max_rows ? max_rows : rows);
    for (int64_t r = 0; r < max_rows; ++r)
      for (int l = 0; l < layers; ++l)
        for (int j = 0; j < k; ++j) {
          const int64_t i = (r * layers + l) * k + j;
          EXPECT_EQ(out[i], r < eff ? int64_t(in[i]) : (r * k + j) % e) << rows << " " << r;
        }
  }
}

TEST(StaticUnpack, Refusals) {
  std::vector<uint8_t> in(64);
  std::vector<int64_t> out(64);
  StaticUnpackArgs a;
  a.experts = in.data();
  a.out = out.data();
  a.rows = 5;
  a.max_rows = 4;
  a.layers = 2;
  a.k = 2;
  a.num_experts = 8;
  KernelStatus s = cpu::StaticUnpack(a);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  // Both numbers named.
  EXPECT_NE(s.message.find("5 router rows"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("max_rows = 4"), std::string::npos) << s.message;
  a.rows = 4;
  EXPECT_TRUE(cpu::StaticUnpack(a).ok());
  a.num_experts = 1;  // < K
  s = cpu::StaticUnpack(a);
  EXPECT_NE(s.message.find("num_experts"), std::string::npos) << s.message;
  a.num_experts = 8;
  a.out_layer_stride = 1;  // runs of K = 2 overlap
  s = cpu::StaticUnpack(a);
  EXPECT_NE(s.message.find("overlap"), std::string::npos) << s.message;
  a.out_layer_stride = 2;
  a.out_row_stride = 3;  // row 1 starts inside row 0's layer 1
  EXPECT_FALSE(cpu::StaticUnpack(a).ok());
  a.out_row_stride = -2;
  EXPECT_FALSE(cpu::StaticUnpack(a).ok());
  a.out_row_stride = -1;
  a.out = nullptr;
  EXPECT_FALSE(cpu::StaticUnpack(a).ok());
  a.out = out.data();
  a.in_type = IndexType::kI32;
  EXPECT_FALSE(cpu::StaticUnpack(a).ok());
  a.in_type = IndexType::kU8;
  a.k = 17;
  EXPECT_FALSE(cpu::StaticUnpack(a).ok());
  a.k = 2;
  a.max_rows = 0;  // an empty buffer with an empty micro-batch is valid
  a.rows = 0;
  EXPECT_TRUE(cpu::StaticUnpack(a).ok());
}

}  // namespace
}  // namespace rollpack::kernels
