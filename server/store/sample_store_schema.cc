// A pool's fields: the token fields (names, dtypes, trailing shapes) and
// the ragged fields' names (layout.md section 13) every sample of it
// carries, fixed by its first accepted sample, by its registration's
// declared token fields, or in a cluster by the first member's (etcd).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "server/store/ndarray.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace {

std::string ShapeString(const std::vector<int64_t>& trailing) {
  return absl::StrCat("[n", trailing.empty() ? "" : ", ", absl::StrJoin(trailing, ", "), "]");
}

std::string NameList(const std::set<std::string>& names) {
  return absl::StrCat("{", absl::StrJoin(names, ", "), "}");
}

}  // namespace

BatchSchema SampleStore::ProposeSchema(const std::vector<StoredSample>& samples) {
  BatchSchema batch;
  for (const StoredSample& s : samples) {
    if (s.piece_message.has_value() && s.piece_message->index > 0) continue;
    for (const auto& [name, field] : s.token_fields) {
      batch.token_fields[name] = FieldSchema{field.dtype, field.trailing_shape};
    }
    for (const auto& [name, field] : s.ragged_fields) batch.ragged.insert(name);
    break;
  }
  return batch;
}

void SampleStore::FixSchema(Pool& pool, BatchSchema batch) {
  if (!pool.schema_fixed) {
    pool.schema = std::move(batch.token_fields);
    pool.schema_fixed = true;
  }
  if (!pool.ragged_schema.has_value()) pool.ragged_schema = std::move(batch.ragged);
}

absl::Status SampleStore::FixSchemaClusterWide(const std::string& pool_name,
                                               const std::vector<StoredSample>& samples) {
  if (pool_directory_ == nullptr || !pool_directory_->FixesSchemasBeforePut() ||
      samples.empty()) {
    return absl::OkStatus();
  }
  std::optional<std::map<std::string, FieldSchema>> declared;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = pools_.find(pool_name);
    // An unknown pool is refused by the put itself.
    if (it == pools_.end()) return absl::OkStatus();
    const Pool& pool = it->second;
    if (pool.schema_fixed && pool.ragged_schema.has_value()) return absl::OkStatus();
    if (pool.schema_fixed) declared = pool.schema;
  }
  // A later piece carries no fields of its own to propose (and is refused
  // unless its piece 0 fixed the schema already).
  auto first = std::find_if(samples.begin(), samples.end(), [](const StoredSample& s) {
    return !s.piece_message.has_value() || s.piece_message->index == 0;
  });
  if (first == samples.end()) return absl::OkStatus();
  // A pool that declared its token fields proposes those (every member
  // holds the same), with its first sample's ragged names: one record in
  // etcd fixes both for the cluster.
  std::map<std::string, FieldSchema> proposed;
  if (declared.has_value()) {
    proposed = *std::move(declared);
  } else {
    for (const auto& [name, field] : first->token_fields) {
      proposed[name] = FieldSchema{field.dtype, field.trailing_shape};
    }
  }
  for (const auto& [name, field] : first->ragged_fields) {
    proposed[name] = FieldSchema{field.dtype, {}, /*ragged=*/true};
  }
  ASSIGN_OR_RETURN(auto fixed, pool_directory_->FixSchema(pool_name, proposed));
  // A schema fixed before ragged fields existed holds none.
  BatchSchema batch;
  for (auto& [name, field] : fixed) {
    if (field.ragged) {
      batch.ragged.insert(name);
    } else {
      batch.token_fields.emplace(name, std::move(field));
    }
  }
  absl::MutexLock lock(&mu_);
  FixSchema(pools_.at(pool_name), std::move(batch));
  return absl::OkStatus();
}

absl::Status SampleStore::CheckSchema(const Pool& pool, const StoredSample& sample,
                                      const BatchSchema& batch) const {
  const std::map<std::string, FieldSchema>& schema =
      pool.schema_fixed ? pool.schema : batch.token_fields;
  const std::string who = absl::StrCat("sample \"", sample.sample_id, "\": ");
  for (const auto& [name, field] : sample.token_fields) {
    auto it = schema.find(name);
    if (it == schema.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "token_fields[\"", name, "\"] is not among the pool's fields {",
          absl::StrJoin(schema, ", ", [](std::string* out, const auto& kv) { out->append(kv.first); }),
          "} (", pool.options.token_fields.empty() ? "fixed by its first sample" : "declared at registration", ")"));
    }
    if (it->second.dtype != field.dtype || it->second.trailing_shape != field.trailing_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "token_fields[\"", name, "\"] is ", DTypeName(field.dtype), " ",
          ShapeString(field.trailing_shape), ", the pool's is ", DTypeName(it->second.dtype), " ",
          ShapeString(it->second.trailing_shape)));
    }
  }
  if (sample.token_fields.size() != schema.size()) {
    for (const auto& [name, unused] : schema) {
      if (!sample.token_fields.count(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, "token_fields[\"", name, "\"] is missing (every sample of the pool carries it)"));
      }
    }
  }
  const std::set<std::string>& ragged =
      pool.ragged_schema.has_value() ? *pool.ragged_schema : batch.ragged;
  for (const auto& [name, field] : sample.ragged_fields) {
    if (ragged.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "ragged_token_fields[\"", name, "\"] is not among the pool's ragged fields ",
          NameList(ragged), " (fixed by its first sample)"));
    }
  }
  if (sample.ragged_fields.size() != ragged.size()) {
    for (const std::string& name : ragged) {
      if (!sample.ragged_fields.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, "ragged_token_fields[\"", name,
            "\"] is missing (every sample of the pool carries it)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace rollpack
