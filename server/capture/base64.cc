#include "server/capture/base64.h"

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace rollpack {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr uint32_t kInvalid = 0x01000000u;

// Four tables, one per place in a group of 4 characters, each giving the
// character's 6 bits already shifted to where they land in the 3 bytes (as
// a little-endian word), or kInvalid: a group decodes with 4 loads and 3 ORs.
struct GroupTables {
  std::array<uint32_t, 256> place[4];
  std::array<int8_t, 256> value;

  GroupTables() {
    for (auto& table : place) table.fill(kInvalid);
    value.fill(-1);
    for (uint32_t v = 0; v < 64; ++v) {
      const auto c = static_cast<unsigned char>(kAlphabet[v]);
      value[c] = static_cast<int8_t>(v);
      place[0][c] = v << 2;
      place[1][c] = (v >> 4) | ((v & 0xf) << 12);
      place[2][c] = ((v >> 2) << 8) | ((v & 0x3) << 22);
      place[3][c] = v << 16;
    }
  }
};

const GroupTables& Tables() {
  static const GroupTables* const tables = new GroupTables;
  return *tables;
}

absl::Status NotBase64(absl::string_view text, size_t at, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("not base64 at offset ", at, " of ",
                                                 text.size(), ": ", why));
}

absl::Status Invalid(absl::string_view text, size_t at) {
  const auto c = static_cast<unsigned char>(text[at]);
  return NotBase64(text, at,
                   c == '=' ? "'=' before the end"
                            : absl::StrCat("character ", static_cast<int>(c), " is not in the "
                                           "alphabet"));
}

// Decodes the groups of text[from, to) (whole groups without padding) to
// out; `to` - `from` is a multiple of 4.
absl::Status DecodeGroups(absl::string_view text, size_t from, size_t to, char* out) {
  const GroupTables& t = Tables();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = from; i < to; i += 4, out += 3) {
    const uint32_t word = t.place[0][s[i]] | t.place[1][s[i + 1]] | t.place[2][s[i + 2]] |
                          t.place[3][s[i + 3]];
    if ((word & kInvalid) != 0) {
      for (size_t k = i; k < i + 4; ++k) {
        if (t.value[s[k]] < 0) return Invalid(text, k);
      }
    }
    // Little endian: the 3 decoded bytes are the word's low 3.
    out[0] = static_cast<char>(word);
    out[1] = static_cast<char>(word >> 8);
    out[2] = static_cast<char>(word >> 16);
  }
  return absl::OkStatus();
}

// The last group, which may end in one or two '=': its bytes to out.
absl::StatusOr<size_t> DecodeLastGroup(absl::string_view text, char* out) {
  const GroupTables& t = Tables();
  const size_t at = text.size() - 4;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + at;
  const int pad = (s[3] == '=') + (s[3] == '=' && s[2] == '=');
  int v[4] = {0, 0, 0, 0};
  for (int k = 0; k < 4 - pad; ++k) {
    v[k] = t.value[s[k]];
    if (v[k] < 0) return Invalid(text, at + k);
  }
  const uint32_t bits = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) |
                        uint32_t(v[3]);
  // RFC 4648 section 3.5: the bits past the last byte are zero.
  if ((pad == 1 && (bits & 0xff) != 0) || (pad == 2 && (bits & 0xffff) != 0)) {
    return NotBase64(text, at + 3 - pad, "bits left over before the padding");
  }
  out[0] = static_cast<char>(bits >> 16);
  if (pad < 2) out[1] = static_cast<char>(bits >> 8);
  if (pad < 1) out[2] = static_cast<char>(bits);
  return static_cast<size_t>(3 - pad);
}

absl::Status CheckShape(absl::string_view text, absl::Span<char> out) {
  if (text.size() % 4 != 0) {
    return NotBase64(text, text.size(), "its length is not a multiple of 4");
  }
  if (out.size() < Base64DecodedSize(text)) {
    return absl::InvalidArgumentError(absl::StrCat("base64 of ", text.size(), " characters needs ",
                                                   Base64DecodedSize(text), " bytes, ",
                                                   out.size(), " given"));
  }
  return absl::OkStatus();
}

// 32 characters to 24 bytes a step; a step that finds a character outside
// the alphabet stops the loop, and the scalar code names it. Returns the
// characters decoded (a multiple of 32, all before the last group).
__attribute__((target("avx2"))) size_t DecodeBlocksAvx2(absl::string_view text, size_t limit,
                                                        char* out, size_t out_room) {
  // Per character: its low nibble's and high nibble's classes, which
  // intersect exactly for characters outside the alphabet; then the offset
  // ("roll") that maps each class of character to its 6-bit value.
  const __m256i lut_lo = _mm256_setr_epi8(
      0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x13, 0x1a, 0x1b, 0x1b, 0x1b,
      0x1a, 0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x13, 0x1a, 0x1b, 0x1b,
      0x1b, 0x1a);
  const __m256i lut_hi = _mm256_setr_epi8(
      0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,
      0x10, 0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,
      0x10, 0x10);
  const __m256i lut_roll = _mm256_setr_epi8(0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0,
                                            0, 0);
  const __m256i mask_2f = _mm256_set1_epi8(0x2f);
  // Packs 4 x 6 bits into 3 bytes per 32-bit lane, then the lanes' 12
  // bytes each into the low 24 bytes.
  const __m256i merge_pairs = _mm256_set1_epi32(0x01400140);
  const __m256i merge_quads = _mm256_set1_epi32(0x00011000);
  const __m256i order = _mm256_setr_epi8(2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1,
                                         2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, -1, -1);
  size_t done = 0;
  // A step stores 32 bytes of which 24 are decoded: it needs that room.
  while (done + 32 <= limit && (done / 4) * 3 + 32 <= out_room) {
    __m256i in = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(text.data() + done));
    const __m256i hi_nibbles = _mm256_and_si256(_mm256_srli_epi32(in, 4), mask_2f);
    const __m256i lo_nibbles = _mm256_and_si256(in, mask_2f);
    const __m256i lo = _mm256_shuffle_epi8(lut_lo, lo_nibbles);
    const __m256i hi = _mm256_shuffle_epi8(lut_hi, hi_nibbles);
    if (!_mm256_testz_si256(lo, hi)) break;
    const __m256i is_slash = _mm256_cmpeq_epi8(in, mask_2f);
    const __m256i roll = _mm256_shuffle_epi8(lut_roll, _mm256_add_epi8(is_slash, hi_nibbles));
    in = _mm256_add_epi8(in, roll);
    __m256i packed = _mm256_madd_epi16(_mm256_maddubs_epi16(in, merge_pairs), merge_quads);
    packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(packed, order), lanes);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (done / 4) * 3), packed);
    done += 32;
  }
  return done;
}

}  // namespace

size_t Base64DecodedSize(absl::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return text.size() / 4 * 3;
  return text.size() / 4 * 3 - (text.back() == '=') - (text.size() >= 2 && text.back() == '=' &&
                                                       text[text.size() - 2] == '=');
}

namespace base64_internal {

bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

absl::StatusOr<size_t> DecodeScalar(absl::string_view text, absl::Span<char> out) {
  if (absl::Status shape = CheckShape(text, out); !shape.ok()) return shape;
  if (text.empty()) return size_t{0};
  const size_t last = text.size() - 4;
  if (absl::Status s = DecodeGroups(text, 0, last, out.data()); !s.ok()) return s;
  absl::StatusOr<size_t> tail = DecodeLastGroup(text, out.data() + last / 4 * 3);
  if (!tail.ok()) return tail.status();
  return last / 4 * 3 + *tail;
}

absl::StatusOr<size_t> DecodeAvx2(absl::string_view text, absl::Span<char> out) {
  if (absl::Status shape = CheckShape(text, out); !shape.ok()) return shape;
  if (text.empty()) return size_t{0};
  const size_t last = text.size() - 4;
  const size_t done = DecodeBlocksAvx2(text, last, out.data(), out.size());
  if (absl::Status s = DecodeGroups(text, done, last, out.data() + done / 4 * 3); !s.ok()) {
    return s;
  }
  absl::StatusOr<size_t> tail = DecodeLastGroup(text, out.data() + last / 4 * 3);
  if (!tail.ok()) return tail.status();
  return last / 4 * 3 + *tail;
}

}  // namespace base64_internal

absl::StatusOr<size_t> DecodeBase64(absl::string_view text, absl::Span<char> out) {
  return base64_internal::CpuHasAvx2() ? base64_internal::DecodeAvx2(text, out)
                                       : base64_internal::DecodeScalar(text, out);
}

}  // namespace rollpack
