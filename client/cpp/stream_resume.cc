#include "client/cpp/stream_resume.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace rollpack {
namespace {

uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// splitmix64's finaliser: consecutive attempts of one seed get unrelated
// factors.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

absl::Status WithResumeFrom(const absl::Status& status, int64_t index) {
  if (status.ok()) return status;
  // Wrapped again (a stream's error seen by the layer above): one index,
  // the latest, in the message as in the payload.
  absl::string_view message = status.message();
  if (std::optional<int64_t> earlier = ResumeFrom(status); earlier.has_value()) {
    absl::ConsumeSuffix(&message, absl::StrCat("; resume from micro-batch ", *earlier));
  }
  absl::Status out(status.code(), absl::StrCat(message, "; resume from micro-batch ", index));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  out.SetPayload(kResumeFromTypeUrl, absl::Cord(absl::StrCat(index)));
  return out;
}

std::optional<int64_t> ResumeFrom(const absl::Status& status) {
  const auto payload = status.GetPayload(kResumeFromTypeUrl);
  if (!payload.has_value()) return std::nullopt;
  int64_t index = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &index) || index < 0) return std::nullopt;
  return index;
}

absl::Duration ResumeDelay(const ResumeBackoff& backoff, int attempt, uint64_t seed) {
  absl::Duration d = std::max(backoff.initial, absl::ZeroDuration());
  const absl::Duration cap = std::max(backoff.max, absl::ZeroDuration());
  for (int i = 0; i < attempt && d > absl::ZeroDuration() && d < cap; ++i) d *= 2;
  d = std::min(d, cap);
  // 53 random bits -> [0, 1).
  const double u = static_cast<double>(Mix(seed ^ Mix(static_cast<uint64_t>(attempt))) >> 11) /
                   static_cast<double>(uint64_t{1} << 53);
  return d * (1.0 - 0.25 * u);
}

uint64_t ResumeSeed(const std::string& step_id, const v1::RankCoords& rank) {
  uint64_t h = Fnv1a(0xcbf29ce484222325ull, step_id.data(), step_id.size());
  const int32_t coords[4] = {rank.dp(), rank.cp(), rank.tp(), rank.pp()};
  return Fnv1a(h, coords, sizeof(coords));
}

}  // namespace rollpack
