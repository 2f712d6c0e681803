#include "server/capture/npy_header.h"

#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

// A .npy file as numpy writes it: version `major`, `dict` padded with
// spaces and a newline to a multiple of 64 bytes, then `data`.
std::string Npy(const std::string& dict, const std::string& data, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string file("\x93NUMPY", 6);
  file += static_cast<char>(major);
  file += '\0';
  const size_t n = header.size();
  file += static_cast<char>(n & 0xff);
  file += static_cast<char>((n >> 8) & 0xff);
  if (major != 1) {
    file += static_cast<char>((n >> 16) & 0xff);
    file += static_cast<char>((n >> 24) & 0xff);
  }
  return file + header + data;
}

TEST(NpyTest, ReadsWhatNumpyWrites) {
  // np.save(f, np.arange(6, dtype='<i2').reshape(2, 3)), byte for byte.
  const std::string numpy_wrote =
      std::string("\x93NUMPY\x01\x00v\x00", 10) +
      "{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3), }" + std::string(58, ' ') +
      "\n" + std::string("\x00\x00\x01\x00\x02\x00\x03\x00\x04\x00\x05\x00", 12);
  ASSERT_EQ(numpy_wrote.size(), 140u);
  absl::StatusOr<NpyArray> a = ParseNpy(numpy_wrote);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->descr, "<i2");
  EXPECT_EQ(a->item_bytes, 2);
  EXPECT_TRUE(a->is_signed);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(a->data.size(), 12u);
  int16_t last;
  std::memcpy(&last, a->data.data() + 10, 2);
  EXPECT_EQ(last, 5);
}

TEST(NpyTest, ReadsEveryVersionKeyOrderAndEmptyArrays) {
  for (int major : {1, 2, 3}) {
    absl::StatusOr<NpyArray> a = ParseNpy(
        Npy("{'shape': (0, 48, 8), 'fortran_order': False, 'descr': '|u1'}", "", major));
    ASSERT_TRUE(a.ok()) << major << ": " << a.status();
    EXPECT_EQ(a->shape, (std::vector<int64_t>{0, 48, 8}));
    EXPECT_EQ(a->item_bytes, 1);
    EXPECT_FALSE(a->is_signed);
  }
  absl::StatusOr<NpyArray> scalar =
      ParseNpy(Npy("{'descr': '<i4', 'fortran_order': False, 'shape': (), }", "abcd"));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->shape.empty());
  absl::StatusOr<NpyArray> one =
      ParseNpy(Npy("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", "abcdef"));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->shape, (std::vector<int64_t>{3}));
}

TEST(NpyTest, RefusesWhatIsNotALittleEndianIntegerArrayInCOrder) {
  const std::string data(24, '\0');
  struct Case {
    std::string file;
    const char* says;
  };
  const Case cases[] = {
      {"\x93NUMPX" + Npy("{'descr': '<i2', 'fortran_order': False, 'shape': (12,), }", data)
                         .substr(6),
       "magic"},
      {Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", data), "integer"},
      {Npy("{'descr': '>i4', 'fortran_order': False, 'shape': (6,), }", data), "little endian"},
      {Npy("{'descr': '|i2', 'fortran_order': False, 'shape': (12,), }", data), "little endian"},
      {Npy("{'descr': '<i2', 'fortran_order': True, 'shape': (12,), }", data), "Fortran"},
      {Npy("{'descr': '<i2', 'fortran_order': False, 'shape': (13,), }", data),
       "26 bytes, the file holds 24"},
      {Npy("{'descr': '<i2', 'fortran_order': False, 'shape': (-12,), }", data), "non-negative"},
      {Npy("{'descr': '<i2', 'fortran_order': False}", data), "lacks"},
      {Npy("{'descr': '<i2', 'fortran_order': False, 'shape': (12,), 'x': 1}", data), "unknown"},
      {Npy("['descr']", data), "not a dict"},
      {Npy("{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }",
           data),
       "too large"},
      {Npy("{'descr': '<i2', 'fortran_order': False, 'shape': (12,), }", data, 4), "version 4"},
      {std::string("\x93NUMPY\x01\x00\xff\x00{'descr'", 17), "cut short"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<NpyArray> a = ParseNpy(c.file);
    ASSERT_FALSE(a.ok()) << c.says;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find(c.says), absl::string_view::npos) << a.status();
  }
}

}  // namespace
}  // namespace rollpack
