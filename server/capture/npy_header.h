// The .npy file format (numpy's NEP 1), in which vLLM returns a choice's
// routed experts as base64 (shared/spec/capture.md section 3.1): a magic,
// a version, and a Python dict literal naming the dtype, the order and the
// shape, then the array's bytes. The same rules as the Python adapter's
// decode_npy (client/python/rollpack/adapters/vllm.py), in C++ for the
// capture port.
#ifndef ROLLPACK_SERVER_CAPTURE_NPY_HEADER_H_
#define ROLLPACK_SERVER_CAPTURE_NPY_HEADER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rollpack {

// An integer array inside a .npy file (routing ids are integers).
struct NpyArray {
  std::string descr;            // as written: "<i4", "|u1", ...
  int item_bytes = 0;           // 1, 2, 4 or 8
  bool is_signed = false;
  std::vector<int64_t> shape;   // C order
  absl::string_view data;       // the elements, little endian, within the file
};

// The array of `file` (the .npy bytes). INVALID_ARGUMENT naming what is
// wrong: no magic, an unknown version, a header cut short or not a dict of
// 'descr', 'fortran_order' and 'shape', a dtype other than a little-endian
// (or one-byte) integer, Fortran order, a negative dimension, or data whose
// length is not the shape's.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view file);

// ParseNpy in two steps, for a file decoded piece by piece: the bytes before
// the data (magic, version, header length and header) from the file's
// first 12 bytes (or all of a shorter file), then the array those bytes
// describe (`data` left empty: the caller checks the data's length against
// NpyDataBytes). The same errors as ParseNpy.
absl::StatusOr<size_t> NpyHeaderBytes(absl::string_view file_start);
absl::StatusOr<NpyArray> ParseNpyHeader(absl::string_view header);
// The data bytes `array`'s shape and dtype take (ParseNpyHeader has checked
// that they fit an int64).
int64_t NpyDataBytes(const NpyArray& array);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_NPY_HEADER_H_
