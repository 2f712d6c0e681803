#include "testing/in_memory_key_value_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rollpack {
namespace {

// In the message of every call failed by an outage: what tells etcd away
// (reachability) from etcd refusing a request.
constexpr char kOutageMarker[] = "etcd is away";

// A member's client of an InMemoryEtcd: its own reachability, listener and
// leaving deadline, as each member's EtcdClient has.
class InMemoryKeyValueStore final : public KeyValueStore {
 public:
  InMemoryKeyValueStore(std::shared_ptr<InMemoryEtcd> etcd, absl::Duration grace)
      : etcd_(std::move(etcd)), reachability_(grace) {}

  absl::StatusOr<std::optional<EtcdKeyValue>> GetEntry(const std::string& key) override {
    return Observed(etcd_->GetEntry(key));
  }
  absl::StatusOr<KeyRevisions> Revisions(const std::string& key) override {
    return Observed(etcd_->Revisions(key));
  }
  absl::StatusOr<std::vector<EtcdKeyValue>> ListPrefix(const std::string& prefix,
                                                       int64_t* revision = nullptr) override {
    return Observed(etcd_->ListPrefix(prefix, revision));
  }
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> ListPrefixKeys(
      const std::string& prefix) override {
    absl::StatusOr<std::vector<EtcdKeyValue>> kvs = Observed(etcd_->ListPrefix(prefix, nullptr));
    if (!kvs.ok()) return kvs.status();
    std::vector<std::pair<std::string, int64_t>> out;
    out.reserve(kvs->size());
    for (EtcdKeyValue& kv : *kvs) out.emplace_back(std::move(kv.key), kv.mod_revision);
    return out;
  }
  absl::Status Put(const std::string& key, const std::string& value,
                   int64_t lease = 0) override {
    return Observed(etcd_->Put(key, value, lease));
  }
  absl::StatusOr<bool> ReplaceIfUnchanged(const std::string& key, int64_t mod_revision,
                                          const std::string& value, int64_t lease = 0) override {
    return Observed(etcd_->ReplaceIfUnchanged(key, mod_revision, value, lease));
  }
  absl::StatusOr<std::string> CreateIfAbsent(const std::string& key, const std::string& value,
                                             bool* created, int64_t lease = 0,
                                             int64_t* mod_revision = nullptr) override {
    return Observed(etcd_->CreateIfAbsent(key, value, created, lease, mod_revision));
  }
  absl::Status Delete(const std::string& key) override { return Observed(etcd_->Delete(key)); }
  absl::StatusOr<int64_t> DeleteAll(const std::vector<std::string>& keys) override {
    return Observed(etcd_->DeleteAll(keys));
  }
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) override {
    return Observed(etcd_->GrantLease(ttl));
  }
  absl::Status KeepAlive(int64_t lease) override { return Observed(etcd_->KeepAlive(lease)); }
  absl::Status RevokeLease(int64_t lease) override {
    return Observed(etcd_->RevokeLease(lease));
  }

  // Nothing is retried here: every call is one attempt already.
  void StopRetrying(absl::Duration) override {}
  const std::string& endpoints() const override { return endpoints_; }
  absl::Time last_trouble() const override {
    absl::MutexLock lock(&mu_);
    return last_trouble_;
  }
  const EtcdReachability& reachability() const override { return reachability_; }
  void SetReachabilityListener(std::function<void(bool reachable)> listener) override {
    absl::MutexLock lock(&mu_);
    listener_ = std::move(listener);
  }
  bool Probe(absl::Duration) const override {
    return Observed(etcd_->Revisions(std::string(1, '\0'))).ok();
  }

 private:
  // Records the call's outcome as EtcdClient::Record does: UNAVAILABLE is
  // etcd not answering, any other answer is etcd answering.
  template <typename T>
  T Observed(T result) const {
    const absl::Status status = StatusOf(result);
    const bool failed = absl::IsUnavailable(status) &&
                        absl::StrContains(status.message(), kOutageMarker);
    const absl::Time now = etcd_->Now();
    std::function<void(bool)> listener;
    EtcdReachability::Change change = EtcdReachability::Change::kNone;
    {
      absl::MutexLock lock(&mu_);
      if (failed || failing_) last_trouble_ = now;
      failing_ = failed;
      change = reachability_.Observe(now, now, failed, status.message());
      listener = listener_;
    }
    if (change != EtcdReachability::Change::kNone && listener) {
      listener(change == EtcdReachability::Change::kRegained);
    }
    return result;
  }
  static absl::Status StatusOf(const absl::Status& s) { return s; }
  template <typename V>
  static absl::Status StatusOf(const absl::StatusOr<V>& s) {
    return s.status();
  }

  const std::shared_ptr<InMemoryEtcd> etcd_;
  const std::string endpoints_ = "in-memory etcd";
  mutable EtcdReachability reachability_;
  mutable absl::Mutex mu_;
  mutable bool failing_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Time last_trouble_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::function<void(bool)> listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<InMemoryEtcd> InMemoryEtcd::Create(std::function<absl::Time()> clock) {
  if (clock == nullptr) clock = [] { return absl::Now(); };
  return std::shared_ptr<InMemoryEtcd>(new InMemoryEtcd(std::move(clock)));
}

std::unique_ptr<KeyValueStore> InMemoryEtcd::NewClient(absl::Duration grace) {
  return std::make_unique<InMemoryKeyValueStore>(shared_from_this(), grace);
}

void InMemoryEtcd::StartOutage(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  outage_until_ = duration == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                       : clock_() + duration;
}

void InMemoryEtcd::EndOutage() {
  absl::MutexLock lock(&mu_);
  outage_until_ = absl::InfinitePast();
}

absl::Status InMemoryEtcd::ExpireLease(int64_t lease) {
  absl::MutexLock lock(&mu_);
  if (leases_.count(lease) == 0) {
    return absl::NotFoundError(absl::StrCat("in-memory etcd: no lease ", lease));
  }
  EndLease(lease);
  return absl::OkStatus();
}

int64_t InMemoryEtcd::revision() const {
  absl::MutexLock lock(&mu_);
  return revision_;
}

std::vector<int64_t> InMemoryEtcd::leases() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> out;
  const absl::Time now = clock_();
  for (const auto& [id, lease] : leases_) {
    if (lease.expires > now) out.push_back(id);
  }
  return out;
}

int64_t InMemoryEtcd::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

void InMemoryEtcd::ExpireDue() {
  const absl::Time now = clock_();
  std::vector<int64_t> due;
  for (const auto& [id, lease] : leases_) {
    if (lease.expires <= now) due.push_back(id);
  }
  for (int64_t id : due) EndLease(id);
}

absl::Status InMemoryEtcd::Answer(const std::string& what) {
  ++calls_;
  ExpireDue();
  if (clock_() < outage_until_) {
    return absl::UnavailableError(absl::StrCat("etcd (in-memory etcd): ", what, ": ",
                                               kOutageMarker));
  }
  return absl::OkStatus();
}

absl::Status InMemoryEtcd::CheckLease(int64_t lease, const std::string& what) const {
  if (lease == 0 || leases_.count(lease) > 0) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("etcd (in-memory etcd): ", what,
                                             ": etcdserver: requested lease not found"));
}

void InMemoryEtcd::PutAt(const std::string& key, const std::string& value, int64_t lease,
                         int64_t revision) {
  Entry& entry = keys_[key];
  if (entry.create_revision == 0) entry.create_revision = revision;
  if (entry.lease != 0 && entry.lease != lease) {
    auto old = leases_.find(entry.lease);
    if (old != leases_.end()) old->second.keys.erase(key);
  }
  entry.value = value;
  entry.lease = lease;
  entry.mod_revision = revision;
  ++entry.version;
  if (lease != 0) leases_[lease].keys.insert(key);
}

bool InMemoryEtcd::Remove(const std::string& key) {
  auto it = keys_.find(key);
  if (it == keys_.end()) return false;
  if (it->second.lease != 0) {
    auto lease = leases_.find(it->second.lease);
    if (lease != leases_.end()) lease->second.keys.erase(key);
  }
  keys_.erase(it);
  return true;
}

void InMemoryEtcd::EndLease(int64_t lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return;
  const std::set<std::string> keys = std::move(it->second.keys);
  leases_.erase(it);
  // etcd deletes a lease's keys in one transaction: one revision, if any.
  bool removed = false;
  for (const std::string& key : keys) removed = keys_.erase(key) > 0 || removed;
  if (removed) ++revision_;
}

absl::StatusOr<std::optional<EtcdKeyValue>> InMemoryEtcd::GetEntry(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Answer(absl::StrCat("get ", key)); !s.ok()) return s;
  auto it = keys_.find(key);
  if (it == keys_.end()) return std::optional<EtcdKeyValue>();
  return std::optional<EtcdKeyValue>(
      EtcdKeyValue{key, it->second.value, it->second.lease, it->second.mod_revision});
}

absl::StatusOr<KeyRevisions> InMemoryEtcd::Revisions(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Answer(absl::StrCat("get ", key)); !s.ok()) return s;
  auto it = keys_.find(key);
  if (it == keys_.end()) return KeyRevisions{};
  return KeyRevisions{it->second.create_revision, it->second.mod_revision};
}

absl::StatusOr<std::vector<EtcdKeyValue>> InMemoryEtcd::ListPrefix(const std::string& prefix,
                                                                  int64_t* revision) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Answer(absl::StrCat("list ", prefix)); !s.ok()) return s;
  if (revision != nullptr) *revision = revision_;
  std::vector<EtcdKeyValue> out;
  // std::map orders keys bytewise, as etcd does.
  for (auto it = keys_.lower_bound(prefix);
       it != keys_.end() && absl::StartsWith(it->first, prefix); ++it) {
    out.push_back({it->first, it->second.value, it->second.lease, it->second.mod_revision});
  }
  return out;
}

absl::Status InMemoryEtcd::Put(const std::string& key, const std::string& value,
                               int64_t lease) {
  absl::MutexLock lock(&mu_);
  const std::string what = absl::StrCat("put ", key);
  if (absl::Status s = Answer(what); !s.ok()) return s;
  if (absl::Status s = CheckLease(lease, what); !s.ok()) return s;
  PutAt(key, value, lease, ++revision_);
  return absl::OkStatus();
}

absl::StatusOr<bool> InMemoryEtcd::ReplaceIfUnchanged(const std::string& key,
                                                      int64_t mod_revision,
                                                      const std::string& value, int64_t lease) {
  absl::MutexLock lock(&mu_);
  const std::string what = absl::StrCat("replace ", key);
  if (absl::Status s = Answer(what); !s.ok()) return s;
  // etcd compares an absent key's revisions as 0.
  auto it = keys_.find(key);
  const int64_t held = it == keys_.end() ? 0 : it->second.mod_revision;
  if (held != mod_revision) return false;
  if (absl::Status s = CheckLease(lease, what); !s.ok()) return s;
  PutAt(key, value, lease, ++revision_);
  return true;
}

absl::StatusOr<std::string> InMemoryEtcd::CreateIfAbsent(const std::string& key,
                                                         const std::string& value, bool* created,
                                                         int64_t lease, int64_t* mod_revision) {
  absl::MutexLock lock(&mu_);
  *created = false;
  if (mod_revision != nullptr) *mod_revision = 0;
  const std::string what = absl::StrCat("create ", key);
  if (absl::Status s = Answer(what); !s.ok()) return s;
  auto it = keys_.find(key);
  if (it != keys_.end()) {
    if (mod_revision != nullptr) *mod_revision = it->second.mod_revision;
    return it->second.value;
  }
  if (absl::Status s = CheckLease(lease, what); !s.ok()) return s;
  PutAt(key, value, lease, ++revision_);
  *created = true;
  if (mod_revision != nullptr) *mod_revision = revision_;
  return value;
}

absl::Status InMemoryEtcd::Delete(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Answer(absl::StrCat("delete ", key)); !s.ok()) return s;
  if (Remove(key)) ++revision_;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> InMemoryEtcd::DeleteAll(const std::vector<std::string>& keys) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Answer(absl::StrCat("delete ", keys.size(), " keys")); !s.ok()) return s;
  int64_t deleted = 0;
  for (const std::string& key : keys) deleted += Remove(key) ? 1 : 0;
  if (deleted > 0) ++revision_;
  return deleted;
}

absl::StatusOr<int64_t> InMemoryEtcd::GrantLease(absl::Duration ttl) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Answer("grant lease"); !s.ok()) return s;
  // EtcdClient asks for whole seconds, at least one.
  const absl::Duration granted = absl::Seconds(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
  const int64_t id = next_lease_++;
  leases_[id] = Lease{granted, clock_() + granted, {}};
  return id;
}

absl::Status InMemoryEtcd::KeepAlive(int64_t lease) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Answer("keep lease alive"); !s.ok()) return s;
  auto it = leases_.find(lease);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("etcd: lease ", lease, " has expired"));
  }
  it->second.expires = clock_() + it->second.ttl;
  return absl::OkStatus();
}

absl::Status InMemoryEtcd::RevokeLease(int64_t lease) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Answer("revoke lease"); !s.ok()) return s;
  if (absl::Status s = CheckLease(lease, "revoke lease"); !s.ok()) return s;
  EndLease(lease);
  return absl::OkStatus();
}

}  // namespace rollpack
