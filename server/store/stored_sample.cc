#include "server/store/stored_sample.h"

#include <algorithm>

#include "server/store/ndarray.h"

namespace rollpack {

int64_t StoredField::row_bytes() const {
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : trailing_shape) bytes *= d;
  return bytes;
}

std::map<std::string, double> PutScalars(const StoredSample& sample) {
  std::map<std::string, double> put = sample.scalars;
  for (const std::string& name : sample.later_scalars) put.erase(name);
  return put;
}

bool SameAsPut(const StoredSample& stored, const StoredSample& sent) {
  if (stored.later_scalars.empty()) return stored == sent;
  // Compared field by field as operator== does, with the scalars as put.
  return stored.sample_id == sent.sample_id && stored.group_id == sent.group_id &&
         stored.policy_version == sent.policy_version && stored.group_size == sent.group_size &&
         stored.tokens == sent.tokens && stored.experts == sent.experts &&
         stored.row_valid == sent.row_valid && stored.token_fields == sent.token_fields &&
         stored.ragged_fields == sent.ragged_fields &&
         SameScalars(PutScalars(stored), sent.scalars) && sent.later_scalars.empty() &&
         stored.pieces == sent.pieces && !stored.piece_message.has_value() &&
         !sent.piece_message.has_value();
}

int AddLaterScalars(const std::map<std::string, double>& scalars, StoredSample* sample) {
  int added = 0;
  for (const auto& [name, value] : scalars) {
    if (!sample->scalars.emplace(name, value).second) continue;
    auto at = std::lower_bound(sample->later_scalars.begin(), sample->later_scalars.end(), name);
    sample->later_scalars.insert(at, name);
    ++added;
  }
  // Sized exactly, as a copy or a replay sizes it: what it costs in memory
  // is a function of the names alone.
  if (added > 0) sample->later_scalars.shrink_to_fit();
  return added;
}

}  // namespace rollpack
