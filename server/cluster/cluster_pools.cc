// Cluster-wide pool facts (docs/cluster.md, "The model"): a pool's model,
// options and token-field schema, each fixed once in etcd by
// create-if-absent. What this member read from or wrote to etcd is kept
// (pool_facts.h) and answered while etcd is unreachable, or when a call to
// it fails UNAVAILABLE (docs/cluster.md, "When etcd is away").
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "proto/wire/deterministic_bytes.h"
#include "rollpack/v1/ndarray.pb.h"
#include "server/cluster/cluster.h"
#include "server/store/convert.h"

namespace rollpack {
namespace {

absl::StatusOr<ModelSpec> ParseModel(const std::string& key, const std::string& bytes) {
  v1::ModelSpec spec;
  if (!spec.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("etcd key ", key, " does not hold a ModelSpec"));
  }
  return FromProto(spec);
}

absl::StatusOr<PoolOptions> ParseOptions(const std::string& key, const std::string& bytes) {
  v1::PoolOptions parsed;
  if (!parsed.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("etcd key ", key, " does not hold PoolOptions"));
  }
  return FromProto(parsed);
}

// A schema as etcd holds it: a Sample's token fields, dtype and shape
// [0, trailing...], and its ragged fields (layout.md section 13), values of
// the stored dtype and shape [0] (a record from before them has none).
absl::StatusOr<std::map<std::string, FieldSchema>> ParseSchema(const std::string& key,
                                                               const std::string& bytes) {
  v1::Sample fixed;
  if (!fixed.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("etcd key ", key, " does not hold a schema"));
  }
  std::map<std::string, FieldSchema> out;
  for (const auto& [name, array] : fixed.token_fields()) {
    FieldSchema& field = out[name];
    field.dtype = array.dtype();
    field.trailing_shape.assign(array.shape().begin() + std::min(1, array.shape_size()),
                                array.shape().end());
  }
  for (const auto& [name, ragged] : fixed.ragged_token_fields()) {
    out[name] = FieldSchema{ragged.values().dtype(), {}, /*ragged=*/true};
  }
  return out;
}

// `failed` (UNAVAILABLE: etcd did not answer), naming the pool this member
// knows nothing of.
absl::Status NotKnownHere(const absl::Status& failed, const std::string& pool) {
  return absl::Status(failed.code(), absl::StrCat("pool \"", pool,
                                                  "\" is not known to this member: ",
                                                  failed.message()));
}

// A fact this member knows, in place of etcd's answer that failed
// (`failed`): facts do not change once fixed.
template <typename T>
absl::StatusOr<T> KnownOr(std::optional<T> known, const absl::Status& failed,
                          const std::string& pool) {
  if (known.has_value()) return *std::move(known);
  return NotKnownHere(failed, pool);
}

}  // namespace

std::string Cluster::PoolKey(const std::string& pool) const {
  return absl::StrCat("/", options_.name, "/pools/", pool);
}

std::string Cluster::SchemaKey(const std::string& pool) const {
  return absl::StrCat("/", options_.name, "/schemas/", pool);
}

absl::Status Cluster::EtcdAway(absl::string_view what) const {
  const EtcdReachability::State state = etcd_->reachability().state();
  return absl::UnavailableError(absl::StrCat(
      "etcd (", etcd_->endpoints(), ") unreachable for ",
      absl::FormatDuration(absl::Trunc(etcd_->reachability().UnreachableFor(absl::Now()),
                                       absl::Milliseconds(100))),
      ": ", what, " waits for it (last error: ", state.last_error, ")"));
}

void Cluster::RememberPool(const std::string& pool, const ModelSpec& model,
                           const PoolOptions& options) {
  pool_facts_.SetModel(pool, model);
  pool_facts_.SetOptions(pool, options);
}

absl::StatusOr<PoolOptions> Cluster::FixPoolOptions(const std::string& pool,
                                                    const PoolOptions& options) {
  if (!etcd_->reachable()) {
    return KnownOr(pool_facts_.Options(pool), EtcdAway("registering it"), pool);
  }
  const std::string key = Key("pool-options", pool);
  bool created = false;
  absl::StatusOr<std::string> held =
      etcd_->CreateIfAbsent(key, DeterministicBytes(ToProto(options)), &created);
  if (absl::IsUnavailable(held.status())) {
    return KnownOr(pool_facts_.Options(pool), held.status(), pool);
  }
  RETURN_IF_ERROR(held.status());
  ASSIGN_OR_RETURN(PoolOptions fixed, ParseOptions(key, *held));
  pool_facts_.SetOptions(pool, fixed);
  return fixed;
}

absl::StatusOr<PoolOptions> Cluster::LookupPoolOptions(const std::string& pool) {
  if (!etcd_->reachable()) {
    return KnownOr(pool_facts_.Options(pool), EtcdAway("reading its options"), pool);
  }
  const std::string key = Key("pool-options", pool);
  absl::StatusOr<std::optional<std::string>> held = etcd_->Get(key);
  if (absl::IsUnavailable(held.status())) {
    return KnownOr(pool_facts_.Options(pool), held.status(), pool);
  }
  RETURN_IF_ERROR(held.status());
  PoolOptions options;  // none fixed: the defaults
  if (held->has_value()) {
    ASSIGN_OR_RETURN(options, ParseOptions(key, **held));
  }
  pool_facts_.SetOptions(pool, options);
  return options;
}

absl::StatusOr<ModelSpec> Cluster::RegisterPool(const std::string& pool,
                                                const ModelSpec& model, bool* created) {
  *created = false;
  // Known here, the model is answered as etcd would: the caller compares,
  // and the same model is a registration that changes nothing.
  if (!etcd_->reachable()) {
    return KnownOr(pool_facts_.Model(pool), EtcdAway("registering it"), pool);
  }
  const std::string key = PoolKey(pool);
  // Deterministic bytes: the same spec is the same value on every member.
  absl::StatusOr<std::string> held =
      etcd_->CreateIfAbsent(key, DeterministicBytes(ToProto(model)), created);
  if (absl::IsUnavailable(held.status())) {
    return KnownOr(pool_facts_.Model(pool), held.status(), pool);
  }
  RETURN_IF_ERROR(held.status());
  ASSIGN_OR_RETURN(ModelSpec fixed, ParseModel(key, *held));
  pool_facts_.SetModel(pool, fixed);
  return fixed;
}

absl::StatusOr<std::optional<ModelSpec>> Cluster::LookupPool(const std::string& pool) {
  std::optional<ModelSpec> known = pool_facts_.Model(pool);
  if (!etcd_->reachable()) {
    if (known.has_value()) return known;
    return NotKnownHere(EtcdAway("looking it up"), pool);
  }
  const std::string key = PoolKey(pool);
  absl::StatusOr<std::optional<std::string>> held = etcd_->Get(key);
  if (absl::IsUnavailable(held.status())) {
    if (known.has_value()) return known;
    return NotKnownHere(held.status(), pool);
  }
  RETURN_IF_ERROR(held.status());
  if (!held->has_value()) {
    // Never registered, or deleted since: nothing of it is known.
    pool_facts_.Forget(pool);
    return std::optional<ModelSpec>();
  }
  ASSIGN_OR_RETURN(ModelSpec model, ParseModel(key, **held));
  pool_facts_.SetModel(pool, model);
  return std::optional<ModelSpec>(std::move(model));
}

absl::StatusOr<std::vector<std::string>> Cluster::PoolNames() {
  // Only etcd knows every pool: not this member's partial list.
  if (!etcd_->reachable()) return EtcdAway("listing the cluster's pools");
  const std::string prefix = PoolKey("");
  ASSIGN_OR_RETURN(auto kvs, etcd_->GetPrefix(prefix));
  std::vector<std::string> names;
  for (const auto& [key, value] : kvs) names.push_back(key.substr(prefix.size()));
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::map<std::string, FieldSchema>> Cluster::FixSchema(
    const std::string& pool, const std::map<std::string, FieldSchema>& proposed) {
  if (!etcd_->reachable()) {
    return KnownOr(pool_facts_.Schema(pool),
                   EtcdAway("fixing its token-field schema (this member's first batch of it)"),
                   pool);
  }
  // A schema travels as a Sample's token fields: dtype and shape [0, trailing...]
  // (ragged fields: their values so).
  v1::Sample schema;
  for (const auto& [name, field] : proposed) {
    if (field.ragged) {
      v1::NDArray* values = (*schema.mutable_ragged_token_fields())[name].mutable_values();
      values->set_dtype(field.dtype);
      values->add_shape(0);
      continue;
    }
    v1::NDArray& array = (*schema.mutable_token_fields())[name];
    array.set_dtype(field.dtype);
    array.add_shape(0);
    for (int64_t d : field.trailing_shape) array.add_shape(d);
  }
  const std::string key = SchemaKey(pool);
  bool created = false;
  absl::StatusOr<std::string> held =
      etcd_->CreateIfAbsent(key, DeterministicBytes(schema), &created);
  if (absl::IsUnavailable(held.status())) {
    return KnownOr(pool_facts_.Schema(pool), held.status(), pool);
  }
  RETURN_IF_ERROR(held.status());
  ASSIGN_OR_RETURN(auto fixed, ParseSchema(key, *held));
  pool_facts_.SetSchema(pool, fixed);
  return fixed;
}

absl::Status Cluster::LearnSchema(const std::string& pool) {
  if (!etcd_->reachable()) return EtcdAway("reading a pool's token-field schema");
  const std::string key = SchemaKey(pool);
  ASSIGN_OR_RETURN(std::optional<std::string> held, etcd_->Get(key));
  if (!held.has_value()) return absl::OkStatus();  // no sample fixed it yet
  ASSIGN_OR_RETURN(auto schema, ParseSchema(key, *held));
  pool_facts_.SetSchema(pool, schema);
  return absl::OkStatus();
}

}  // namespace rollpack
