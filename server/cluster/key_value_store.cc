#include "server/cluster/key_value_store.h"

#include "base/status_macros.h"

namespace rollpack {

absl::StatusOr<std::optional<std::string>> KeyValueStore::Get(const std::string& key) {
  ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> entry, GetEntry(key));
  if (!entry.has_value()) return std::optional<std::string>();
  return std::optional<std::string>(std::move(entry->value));
}

absl::StatusOr<int64_t> KeyValueStore::CreateRevision(const std::string& key) {
  ASSIGN_OR_RETURN(KeyRevisions revisions, Revisions(key));
  return revisions.create;
}

absl::StatusOr<int64_t> KeyValueStore::ModRevision(const std::string& key) {
  ASSIGN_OR_RETURN(KeyRevisions revisions, Revisions(key));
  return revisions.mod;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> KeyValueStore::GetPrefix(
    const std::string& prefix) {
  ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs, ListPrefix(prefix));
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(kvs.size());
  for (EtcdKeyValue& kv : kvs) out.emplace_back(std::move(kv.key), std::move(kv.value));
  return out;
}

}  // namespace rollpack
