#include "server/ingest/token_field_conversion.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace rollpack {
namespace {

bool IsInteger(v1::DType d) {
  return d == v1::UINT8 || d == v1::UINT16 || d == v1::INT16 || d == v1::INT32 || d == v1::INT64;
}

template <typename T>
T Load(absl::string_view bytes, int64_t i) {
  T v;
  std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

int64_t LoadInteger(v1::DType d, absl::string_view bytes, int64_t i) {
  switch (d) {
    case v1::UINT8: return Load<uint8_t>(bytes, i);
    case v1::UINT16: return Load<uint16_t>(bytes, i);
    case v1::INT16: return Load<int16_t>(bytes, i);
    case v1::INT32: return Load<int32_t>(bytes, i);
    default: return Load<int64_t>(bytes, i);
  }
}

void IntegerRange(v1::DType d, int64_t* lo, int64_t* hi) {
  switch (d) {
    case v1::UINT8: *lo = 0; *hi = 255; return;
    case v1::UINT16: *lo = 0; *hi = 65535; return;
    case v1::INT16: *lo = -32768; *hi = 32767; return;
    case v1::INT32: *lo = std::numeric_limits<int32_t>::min(); *hi = std::numeric_limits<int32_t>::max(); return;
    default: *lo = std::numeric_limits<int64_t>::min(); *hi = std::numeric_limits<int64_t>::max(); return;
  }
}

template <typename T>
void Store(std::string* out, int64_t i, T v) {
  std::memcpy(out->data() + i * sizeof(T), &v, sizeof(T));
}

void StoreInteger(v1::DType d, std::string* out, int64_t i, int64_t v) {
  switch (d) {
    case v1::UINT8: Store<uint8_t>(out, i, static_cast<uint8_t>(v)); return;
    case v1::UINT16: Store<uint16_t>(out, i, static_cast<uint16_t>(v)); return;
    case v1::INT16: Store<int16_t>(out, i, static_cast<int16_t>(v)); return;
    case v1::INT32: Store<int32_t>(out, i, static_cast<int32_t>(v)); return;
    default: Store<int64_t>(out, i, v); return;
  }
}

// IEEE half -> float, exactly (every half is a float).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const int exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  if (exponent == 0x1F) {  // inf or nan
    const uint32_t bits = sign | 0x7F800000u | (mantissa << 13);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -24)
                                        : std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  return sign != 0 ? -magnitude : magnitude;
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

absl::StatusOr<std::string> ConvertTokenField(const ArrayView& view,
                                              const DeclaredTokenField& declared,
                                              absl::string_view what, int64_t per_token) {
  const v1::DType from = view.dtype;
  const v1::DType to = declared.dtype;
  const int64_t count = view.num_elements();
  const int64_t per = per_token > 0 ? per_token : 1;
  auto refused = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", DTypeName(from),
                                                   ", the pool declares ", DTypeName(to), ": ",
                                                   why, " (docs/producer.md#token-field-schema)"));
  };
  auto bad_value = [&](int64_t i, absl::string_view value, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", value, " at token ", i / per,
                                                   " (element ", i, "), ", why, " the pool's ",
                                                   DTypeName(to)));
  };
  std::string out(static_cast<size_t>(count) * DTypeSize(to), '\0');

  if (IsInteger(to)) {
    if (!IsInteger(from)) return refused("only integer inputs convert into an integer field");
    int64_t lo = 0, hi = 0;
    IntegerRange(to, &lo, &hi);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t v = LoadInteger(from, view.data, i);
      if (v < lo || v > hi) {
        return bad_value(i, absl::StrCat(v), absl::StrCat("outside [", lo, ", ", hi, "] of"));
      }
      StoreInteger(to, &out, i, v);
    }
    return out;
  }
  if (to != v1::FLOAT32) return refused("a float16 or bfloat16 field takes its own dtype only");

  constexpr int64_t kExactInFloat = int64_t{1} << 24;
  for (int64_t i = 0; i < count; ++i) {
    float f = 0;
    if (IsInteger(from)) {
      const int64_t v = LoadInteger(from, view.data, i);
      if (v < -kExactInFloat || v > kExactInFloat) {
        return bad_value(i, absl::StrCat(v), "beyond 2^24, not exact in");
      }
      f = static_cast<float>(v);
    } else if (from == v1::FLOAT16) {
      f = HalfToFloat(Load<uint16_t>(view.data, i));
    } else if (from == v1::BFLOAT16) {
      f = BFloat16ToFloat(Load<uint16_t>(view.data, i));
    } else if (from == v1::FLOAT64) {
      if (!declared.allow_narrowing) {
        return refused("float64 is rounded to float32 only where the pool's field says "
                       "allow_narrowing");
      }
      const double d = Load<double>(view.data, i);
      if (std::isfinite(d) && std::fabs(d) > std::numeric_limits<float>::max()) {
        return bad_value(i, absl::StrCat(d), "overflowing");
      }
      f = static_cast<float>(d);
    } else {
      return refused("no conversion");
    }
    Store<float>(&out, i, f);
  }
  return out;
}

}  // namespace rollpack
