// Standard base64 (RFC 4648 section 4: A-Z a-z 0-9 + /, '=' padding), the
// form in which vLLM and SGLang return a choice's routing: megabytes in every
// captured response (shared/spec/capture.md sections 3 and 8, where
// rollpackd's whole time per 8k-token choice is 2 ms). Measured on the
// 2-core VM for 8.4 MB of it (best of 30): AVX2 0.25 ms (~30 GB/s), the
// table-driven scalar decoder here 1.65 ms, absl::Base64Unescape 2.63 ms
// (OpenSSL's EVP_DecodeBlock ~2.5 ms; docs/capture-design.md). The AVX2
// kernel follows Muła and Lemire, "Faster Base64 Encoding and Decoding using
// AVX2 Instructions" (2018).
#ifndef ROLLPACK_SERVER_CAPTURE_BASE64_H_
#define ROLLPACK_SERVER_CAPTURE_BASE64_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace rollpack {

// The bytes `text` decodes to when it is valid (from its length and
// padding); what DecodeBase64 needs of room.
size_t Base64DecodedSize(absl::string_view text);

// Decodes all of `text` into `out` (at least Base64DecodedSize(text)
// bytes) and returns the bytes written. INVALID_ARGUMENT naming the offset
// when `text` is not base64: a length that is not a multiple of 4, a
// character outside the alphabet (whitespace included), '=' anywhere but in
// the last two places, or bits left over in the last group.
absl::StatusOr<size_t> DecodeBase64(absl::string_view text, absl::Span<char> out);

namespace base64_internal {
// The two kernels, for tests: DecodeBase64 uses AVX2 where the CPU has it.
absl::StatusOr<size_t> DecodeScalar(absl::string_view text, absl::Span<char> out);
absl::StatusOr<size_t> DecodeAvx2(absl::string_view text, absl::Span<char> out);
bool CpuHasAvx2();
}  // namespace base64_internal

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_BASE64_H_
