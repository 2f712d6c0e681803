#include "server/store/ndarray.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rollpack {

int DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::UINT8:
      return 1;
    case v1::UINT16:
    case v1::INT16:
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return 2;
    case v1::INT32:
    case v1::FLOAT32:
      return 4;
    case v1::INT64:
    case v1::FLOAT64:
      return 8;
    default:
      return 0;
  }
}

std::string DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::UINT8:
      return "uint8";
    case v1::UINT16:
      return "uint16";
    case v1::INT16:
      return "int16";
    case v1::INT32:
      return "int32";
    case v1::INT64:
      return "int64";
    case v1::FLOAT32:
      return "float32";
    case v1::FLOAT16:
      return "float16";
    case v1::BFLOAT16:
      return "bfloat16";
    case v1::FLOAT64:
      return "float64";
    default:
      return absl::StrCat("dtype(", static_cast<int>(dtype), ")");
  }
}

int64_t ArrayView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<ArrayView> ViewArray(const v1::NDArray& array,
                                    absl::string_view what) {
  const int itemsize = DTypeSize(array.dtype());
  if (itemsize == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": unknown dtype ", DTypeName(array.dtype())));
  }
  ArrayView view;
  view.dtype = array.dtype();
  view.shape.assign(array.shape().begin(), array.shape().end());
  // Bytes may not exceed what the message can carry, so any product beyond
  // int64 is an error long before it overflows.
  constexpr int64_t kMaxBytes = std::numeric_limits<int64_t>::max() / 16;
  int64_t bytes = itemsize;
  for (int i = 0; i < view.rank(); ++i) {
    const int64_t d = view.shape[i];
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": shape [", absl::StrJoin(view.shape, ", "), "] has negative dimension ", i));
    }
    if (d > 0 && bytes > kMaxBytes / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": shape [", absl::StrJoin(view.shape, ", "), "] is too large"));
    }
    bytes *= d;
  }
  if (static_cast<int64_t>(array.data().size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", array.data().size(), " bytes of data, but ",
        DTypeName(view.dtype), " shape [", absl::StrJoin(view.shape, ", "),
        "] needs ", bytes));
  }
  view.data = array.data();
  return view;
}

bool IsEmptyArray(const v1::NDArray& array) {
  return array.dtype() == v1::DTYPE_UNSPECIFIED && array.shape().empty() &&
         array.data().empty();
}

char* ResizeArray(v1::NDArray* out, v1::DType dtype,
                  absl::Span<const int64_t> shape) {
  out->set_dtype(dtype);
  out->mutable_shape()->Assign(shape.begin(), shape.end());
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) bytes *= d;
  std::string* data = out->mutable_data();
  data->resize(static_cast<size_t>(bytes));
  return data->data();
}

void SetInt32Array(v1::NDArray* out, absl::Span<const int32_t> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  char* dst = ResizeArray(out, v1::INT32, {n});
  if (n > 0) std::memcpy(dst, values.data(), values.size() * sizeof(int32_t));
}

}  // namespace rollpack
