#include "client/cpp/sequence_metadata.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

std::string Where(const v1::Microbatch& m) {
  return absl::StrCat("micro-batch ", m.index(), " of step \"", m.step_id(), "\"");
}

std::string Describe(const v1::NDArray& a) {
  return absl::StrCat(v1::DType_Name(a.dtype()), " [", absl::StrJoin(a.shape(), ", "), "] (",
                      a.data().size(), " bytes)");
}

// `a` must be `dtype` [S] with S * elem bytes of data.
absl::Status CheckPerSequence(const v1::Microbatch& m, const std::string& field,
                              const v1::NDArray& a, v1::DType dtype, int64_t elem) {
  const int64_t s = m.sample_ids_size();
  if (a.dtype() == dtype && a.shape_size() == 1 && a.shape(0) == s &&
      static_cast<int64_t>(a.data().size()) == s * elem) {
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat(Where(m), ": ", field, " is ", Describe(a), ", not ",
                                          v1::DType_Name(dtype), " [", s, "] (", s * elem,
                                          " bytes): one value per sequence"));
}

template <typename T>
std::vector<T> Decode(const std::string& data) {
  std::vector<T> out(data.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), data.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace

absl::Status CheckSequenceMetadata(const v1::Microbatch& m) {
  const int s = m.sample_ids_size();
  const int groups = m.group_ids_size();
  const int versions = m.policy_versions_size();
  // Both empty: a server from before these fields; anything else must be
  // one entry per sequence.
  if (!(groups == 0 && versions == 0) && (groups != s || versions != s)) {
    return absl::DataLossError(absl::StrCat(Where(m), ": ", s, " sequences but ", groups,
                                            " group_ids and ", versions,
                                            " policy_versions: one of each per sequence"));
  }
  for (const auto& [name, a] : m.scalars()) {
    RETURN_IF_ERROR(
        CheckPerSequence(m, absl::StrCat("scalars[\"", name, "\"]"), a, v1::FLOAT64, 8));
  }
  if (m.has_advantages()) {
    RETURN_IF_ERROR(CheckPerSequence(m, "advantages", m.advantages(), v1::FLOAT32, 4));
  }
  return absl::OkStatus();
}

absl::StatusOr<SequenceMetadata> ReadSequenceMetadata(const v1::Microbatch& m) {
  RETURN_IF_ERROR(CheckSequenceMetadata(m));
  SequenceMetadata out;
  out.sent = m.sample_ids_size() == 0 || m.group_ids_size() > 0;
  out.group_ids.assign(m.group_ids().begin(), m.group_ids().end());
  out.policy_versions.assign(m.policy_versions().begin(), m.policy_versions().end());
  for (const auto& [name, a] : m.scalars()) out.scalars[name] = Decode<double>(a.data());
  out.has_advantages = m.has_advantages();
  if (out.has_advantages) out.advantages = Decode<float>(m.advantages().data());
  return out;
}

}  // namespace rollpack
