#include "server/cluster/cluster.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/resource_quota.h"
#include "rollpack/v1/member.grpc.pb.h"
#include "rollpack/v1/rollouts.grpc.pb.h"
#include "rollpack/v1/scheduler.grpc.pb.h"
#include "proto/wire/deterministic_bytes.h"
#include "server/cluster/cluster_config_check.h"
#include "server/cluster/peer_calls.h"
#include "server/store/convert.h"
#include "spdlog/spdlog.h"

namespace rollpack {
namespace {

// host:port with a port in 1..65535, at most 255 bytes, no space or control
// byte: what --cluster-advertise accepts.
bool IsMemberAddress(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (address.empty() || address.size() > 255 || colon == absl::string_view::npos ||
      colon == 0) {
    return false;
  }
  for (char c : address) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) return false;
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port)) return false;
  return port >= 1 && port <= 65535;
}

}  // namespace

// One channel per peer, made on first use and kept.
class Cluster::Peers {
 public:
  Peers(std::shared_ptr<grpc::ChannelCredentials> credentials, int64_t max_receive_bytes)
      : credentials_(credentials != nullptr ? std::move(credentials)
                                            : grpc::InsecureChannelCredentials()),
        max_receive_bytes_(static_cast<int>(
            std::clamp<int64_t>(max_receive_bytes, 1, std::numeric_limits<int>::max()))),
        quota_("rollpack-peers") {
    // gRPC refuses a message over the receive bound only once it holds all
    // of it: what the peers' channels may hold together is bounded here, so
    // that a reply of any size is reset at twice the bound (one message up
    // to the bound still fits beside another in flight).
    quota_.Resize(static_cast<size_t>(2 * static_cast<int64_t>(max_receive_bytes_)));
  }

  v1::Rollouts::Stub* Rollouts(const ClusterMember& member) {
    absl::MutexLock lock(&mu_);
    Peer& peer = PeerLocked(member);
    if (peer.rollouts == nullptr) peer.rollouts = v1::Rollouts::NewStub(peer.channel);
    return peer.rollouts.get();
  }
  v1::Scheduler::Stub* Scheduler(const ClusterMember& member) {
    absl::MutexLock lock(&mu_);
    Peer& peer = PeerLocked(member);
    if (peer.scheduler == nullptr) peer.scheduler = v1::Scheduler::NewStub(peer.channel);
    return peer.scheduler.get();
  }
  v1::Member::Stub* Member(const ClusterMember& member) {
    absl::MutexLock lock(&mu_);
    Peer& peer = PeerLocked(member);
    if (peer.member == nullptr) peer.member = v1::Member::NewStub(peer.channel);
    return peer.member.get();
  }

 private:
  struct Peer {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Rollouts::Stub> rollouts;
    std::unique_ptr<v1::Member::Stub> member;
    std::unique_ptr<v1::Scheduler::Stub> scheduler;
  };
  Peer& PeerLocked(const ClusterMember& member) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Peer& peer = peers_[member.address];
    if (peer.channel == nullptr) {
      grpc::ChannelArguments args;
      // A restarted member is found again quickly.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      // ReadSamples batches hold whole samples, as large as the owner took.
      args.SetMaxReceiveMessageSize(max_receive_bytes_);
      args.SetResourceQuota(quota_);
      peer.channel = grpc::CreateCustomChannel(member.address, credentials_, args);
    }
    return peer;
  }

  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const int max_receive_bytes_;
  grpc::ResourceQuota quota_;
  absl::Mutex mu_;
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
};

namespace {

// The name and address, before anything reaches etcd.
absl::Status CheckJoinOptions(const ClusterOptions& options) {
  if (options.name.empty() || absl::StrContains(options.name, '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster-name \"", options.name, "\" must be non-empty and hold no '/'"));
  }
  if (options.advertise.empty() || options.advertise.rfind(':') == std::string::npos ||
      absl::EndsWith(options.advertise, ":0")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster-advertise \"", options.advertise,
        "\" must be the host:port other members reach this one at"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Join(const ClusterOptions& options) {
  RETURN_IF_ERROR(CheckJoinOptions(options));
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Create(options.etcd));
  return Join(options, std::move(etcd));
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Join(const ClusterOptions& options,
                                                       std::unique_ptr<KeyValueStore> etcd) {
  RETURN_IF_ERROR(CheckJoinOptions(options));
  std::unique_ptr<Cluster> cluster(new Cluster(options, std::move(etcd)));
  RETURN_IF_ERROR(cluster->Register());
  // Joined once the roster tells the others too (Members(), after an etcd
  // outage).
  RETURN_IF_ERROR(cluster->KeepRoster());
  // A member drained before its restart refuses new samples from the start.
  RETURN_IF_ERROR(cluster->RefreshSelfDrained());
  WarnIfClusterLooksMisnamed(*cluster->etcd_, options.name, cluster->self_.id);
  int64_t revision = 0;
  if (absl::StatusOr<std::vector<ClusterMember>> members = cluster->ListMembers(&revision);
      members.ok()) {
    absl::MutexLock lock(&cluster->mu_);
    cluster->last_member_count_ = static_cast<int>(members->size());
    cluster->Settle(*std::move(members), revision);
  }
  cluster->keep_alive_ = std::thread([c = cluster.get()] { c->KeepAliveLoop(); });
  return cluster;
}

Cluster::Cluster(ClusterOptions options, std::unique_ptr<KeyValueStore> etcd)
    : options_(std::move(options)),
      self_{options_.advertise, options_.advertise},
      // The address, and what tells this process from another with the
      // same id (a restarted one, or a misconfigured duplicate).
      registration_(absl::StrCat(options_.advertise, "\n", getpid(), "@",
                                 absl::GetCurrentTimeNanos())),
      etcd_(std::move(etcd)),
      peers_(std::make_unique<Peers>(options_.peer_credentials,
                                     options_.peer_max_receive_bytes)) {}

Cluster::~Cluster() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  // An etcd that is gone must not hold up a shutdown (Kubernetes' grace
  // period, a trainer's restart) for every call's total budget: the
  // keep-alive thread's call in flight and the revokes below get one short
  // attempt each, and leases not revoked run out after their TTL.
  etcd_->StopRetrying();
  if (keep_alive_.joinable()) keep_alive_.join();
  // Read after the join: the keep-alive thread may have re-joined with a
  // new lease. A failed revoke is fine: the lease expires after its TTL.
  int64_t lease = 0, roster_lease = 0;
  {
    absl::MutexLock lock(&mu_);
    lease = lease_;
    roster_lease = roster_lease_;
  }
  if (lease != 0) etcd_->RevokeLease(lease).IgnoreError();
  if (roster_lease != 0) etcd_->RevokeLease(roster_lease).IgnoreError();
}

std::string Cluster::MemberKey(const std::string& id) const {
  return absl::StrCat("/", options_.name, "/members/", id);
}

std::string Cluster::RosterKey(const std::string& id) const {
  return absl::StrCat("/", options_.name, "/roster/", id);
}

std::string Cluster::Key(absl::string_view kind, absl::string_view rest) const {
  return absl::StrCat("/", options_.name, "/", kind, "/", rest);
}

v1::Member::Stub* Cluster::MemberStub(const ClusterMember& member) {
  return peers_->Member(member);
}

v1::Rollouts::Stub* Cluster::RolloutsStub(const ClusterMember& member) {
  return peers_->Rollouts(member);
}

absl::StatusOr<v1::PoolInfo> Cluster::SetPolicyVersionOf(const ClusterMember& member,
                                                         const std::string& pool,
                                                         int64_t policy_version) {
  v1::SetPolicyVersionRequest request;
  request.set_pool(pool);
  request.set_policy_version(policy_version);
  request.set_local_only(true);
  v1::PoolInfo info;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::microseconds(absl::ToInt64Microseconds(options_.etcd.timeout)));
  grpc::Status s = peers_->Scheduler(member)->SetPolicyVersion(&context, request, &info);
  if (s.ok()) return info;
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) return absl::NotFoundError(s.error_message());
  // The member's own refusal keeps its code; one that does not answer is
  // UNAVAILABLE naming it.
  return FromPeer(s, member.id, "SetPolicyVersion");
}

absl::Status Cluster::Register() {
  ASSIGN_OR_RETURN(int64_t lease, etcd_->GrantLease(options_.lease_ttl));
  // The key is created, never overwritten: another live member with this
  // id keeps it renewed, while a crashed predecessor's lease runs out
  // within the TTL, so a restart waits for that and a duplicate is refused.
  const absl::Time give_up = absl::Now() + options_.lease_ttl + absl::Seconds(1);
  while (true) {
    bool created = false;
    ASSIGN_OR_RETURN(std::string held,
                     etcd_->CreateIfAbsent(MemberKey(self_.id), registration_, &created, lease));
    if (created || held == registration_) break;
    // A key without a lease is no member's (every member's key has one):
    // written by hand, it would lock this id out for good. Take it over.
    ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> entry, etcd_->GetEntry(MemberKey(self_.id)));
    if (entry.has_value() && entry->lease == 0) {
      spdlog::warn("rollpackd: etcd key {} holds no lease, so no member holds it; taking it over",
                   entry->key);
      ASSIGN_OR_RETURN(bool replaced, etcd_->ReplaceIfUnchanged(entry->key, entry->mod_revision,
                                                                registration_, lease));
      if (replaced) break;
      continue;
    }
    if (absl::Now() >= give_up) {
      etcd_->RevokeLease(lease).IgnoreError();
      return absl::AlreadyExistsError(absl::StrCat(
          "cluster member id ", self_.id, " is held by another live member (",
          held.substr(0, held.find('\n')), "): give each member its own --cluster-advertise"));
    }
    absl::SleepFor(absl::Milliseconds(200));
    // Waiting for a predecessor's lease (as long as ours) must not let
    // ours run out.
    absl::Status renewed = etcd_->KeepAlive(lease);
    if (absl::IsNotFound(renewed)) {
      ASSIGN_OR_RETURN(lease, etcd_->GrantLease(options_.lease_ttl));
    } else if (!renewed.ok()) {
      return renewed;
    }
  }
  roster_due_ = true;
  absl::MutexLock lock(&mu_);
  lease_ = lease;
  return absl::OkStatus();
}

absl::Status Cluster::KeepRoster() {
  // It must outlive the membership lease by far to tell who had joined.
  const absl::Duration ttl = std::max(options_.roster_ttl, 10 * options_.lease_ttl);
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    lease = roster_lease_;
  }
  if (lease != 0 && (roster_due_ || absl::Now() - roster_renewed_ >= ttl / 10)) {
    const absl::Time asked = absl::Now();
    absl::Status renewed = etcd_->KeepAlive(lease);
    if (absl::IsNotFound(renewed)) {
      // etcd was away for longer than the roster TTL: a new lease, and the
      // entry put again on it.
      lease = 0;
      roster_due_ = true;
    } else if (!renewed.ok()) {
      return renewed;
    } else {
      roster_renewed_ = asked;
    }
  }
  if (lease == 0) {
    const absl::Time asked = absl::Now();
    ASSIGN_OR_RETURN(lease, etcd_->GrantLease(ttl));
    roster_renewed_ = asked;
    absl::MutexLock lock(&mu_);
    roster_lease_ = lease;
  }
  if (!roster_due_) return absl::OkStatus();
  // Written after the member key, so that its revision is later than the
  // key's: a list read before the key was written is older than the entry.
  RETURN_IF_ERROR(etcd_->Put(RosterKey(self_.id), registration_, lease));
  roster_due_ = false;
  return absl::OkStatus();
}

void Cluster::KeepAliveLoop() {
  // A third of the TTL: two renewals can fail before the member is dropped.
  const absl::Duration period = options_.lease_ttl / 3;
  // After a failure, sooner: the moment etcd answers again, a lease it
  // revoked meanwhile (it ran out while etcd was away) is replaced, and the
  // others' lists (Members(), waiting for this member) are whole again.
  const absl::Duration retry = std::min(period, absl::Milliseconds(200));
  absl::Duration wait = period;
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(this, &Cluster::RenewDue), wait);
    if (stop_) break;
    renew_now_ = false;
    const int64_t lease = lease_;
    mu_.Unlock();
    absl::Status s = etcd_->KeepAlive(lease);
    int64_t current = lease;
    if (absl::IsNotFound(s)) {
      {
        absl::MutexLock relock(&mu_);
        own_key_lost_ = absl::Now();
      }
      s = Register();  // etcd forgot us: join again, on a new lease
      absl::MutexLock relock(&mu_);
      current = lease_;
    }
    if (s.ok()) s = Reassert(current);
    // The roster entry follows a member key written again at once.
    if (s.ok()) s = KeepRoster();
    if (s.ok()) s = RefreshSelfDrained();
    int64_t revision = 0;
    absl::StatusOr<std::vector<ClusterMember>> members =
        s.ok() ? ListMembers(&revision) : absl::StatusOr<std::vector<ClusterMember>>(s);
    if (members.ok()) WatchMembers(*members);
    mu_.Lock();
    if (members.ok()) {
      last_member_count_ = static_cast<int>(members->size());
      if (absl::Now() >= RejoinDeadline()) Settle(*std::move(members), revision);
    }
    wait = s.ok() ? period : retry;
  }
}

absl::Status Cluster::Reassert(int64_t lease) {
  // Our key deleted, overwritten or detached from our lease by hand while
  // the lease lives: put it back as it was, so the others keep reaching us
  // here and a restart of this member is not refused.
  ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> held, etcd_->GetEntry(MemberKey(self_.id)));
  if (held.has_value() && held->value == registration_ && held->lease == lease) {
    return absl::OkStatus();
  }
  spdlog::warn("rollpackd: etcd key {} {}; putting this member's registration back",
               MemberKey(self_.id),
               !held.has_value() ? "was deleted"
                                 : (held->value != registration_ ? "was overwritten"
                                                                 : "lost this member's lease"));
  roster_due_ = true;
  return etcd_->Put(MemberKey(self_.id), registration_, lease);
}

absl::Time Cluster::RejoinDeadline() const {
  // A live member whose lease etcd revoked renews within a third of the TTL
  // (at once if a renewal was waiting on etcd), finds it gone and joins
  // again; etcd revokes what ran out within a second of answering again.
  return std::max(etcd_->last_trouble(), own_key_lost_) + options_.lease_ttl + absl::Seconds(1);
}

absl::StatusOr<std::vector<ClusterMember>> Cluster::Members() {
  int64_t revision = 0;
  ASSIGN_OR_RETURN(std::vector<ClusterMember> listed, ListMembers(&revision));
  // Bounded per call, however long etcd keeps giving trouble.
  const absl::Time give_up = absl::Now() + options_.lease_ttl + absl::Seconds(1);
  // The roster (member id -> revision of its entry), read once per call and
  // only right after trouble: who joined (again) after the settled list.
  std::optional<std::map<std::string, int64_t>> roster;
  while (true) {
    const auto listed_has = [&listed](const std::string& id) {
      return std::any_of(listed.begin(), listed.end(),
                         [&id](const ClusterMember& m) { return m.id == id; });
    };
    int64_t since = 0;
    {
      absl::MutexLock lock(&mu_);
      if (!listed_has(self_.id) && !stop_) {
        // This member is alive and joined: its key is back at its next
        // renewal, which is now.
        if (absl::Now() - own_key_lost_ > options_.lease_ttl) own_key_lost_ = absl::Now();
        renew_now_ = true;
      }
      // Outside the window etcd's list is the list: a member missing from
      // it left.
      if (absl::Now() >= std::min(RejoinDeadline(), give_up)) {
        Settle(listed, revision);
        return listed;
      }
      const bool missing = std::any_of(settled_.begin(), settled_.end(),
                                       [&](const ClusterMember& m) { return !listed_has(m.id); });
      since = missing ? -1 : settled_revision_;
    }
    if (since >= 0) {
      // Every member of the settled list is listed; so must be every member
      // that joined after that list was read (a member that joined just
      // before etcd went away, which this one had not listed yet).
      if (!roster.has_value()) {
        ASSIGN_OR_RETURN(roster, Roster());
      }
      if (std::all_of(roster->begin(), roster->end(), [&](const auto& entry) {
            return entry.second <= since || listed_has(entry.first);
          })) {
        absl::MutexLock lock(&mu_);
        Settle(listed, revision);
        return listed;
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
    ASSIGN_OR_RETURN(listed, ListMembers(&revision));
  }
}

absl::StatusOr<std::map<std::string, int64_t>> Cluster::Roster() {
  const std::string prefix = RosterKey("");
  ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs, etcd_->ListPrefix(prefix));
  std::map<std::string, int64_t> roster;
  for (const EtcdKeyValue& kv : kvs) {
    // Only what a member writes (on a lease, its own id as its address), as
    // member keys.
    std::string id = kv.key.substr(prefix.size());
    if (kv.lease != 0 && kv.value.substr(0, kv.value.find('\n')) == id) {
      roster.emplace(std::move(id), kv.mod_revision);
    }
  }
  return roster;
}

void Cluster::Settle(std::vector<ClusterMember> members, int64_t revision) {
  if (revision < settled_revision_) return;
  settled_ = std::move(members);
  settled_revision_ = revision;
}

absl::StatusOr<std::vector<ClusterMember>> Cluster::ListMembers(int64_t* revision) {
  ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs, etcd_->ListPrefix(MemberKey(""), revision));
  std::vector<ClusterMember> members;
  members.reserve(kvs.size());
  const size_t prefix = MemberKey("").size();
  for (const EtcdKeyValue& kv : kvs) {
    std::string id = kv.key.substr(prefix);
    std::string address = kv.value.substr(0, kv.value.find('\n'));
    // Only what a member writes counts: a key with a lease (a leaseless one
    // would stay after its writer is gone, and every step would wait on a
    // member that never answers), named by the address it holds.
    std::string problem;
    if (kv.lease == 0) {
      problem = "holds no lease";
    } else if (!IsMemberAddress(address) || id != address) {
      problem = "does not hold a member's host:port under its own name";
    }
    if (!problem.empty()) {
      absl::MutexLock lock(&mu_);
      if (ignored_keys_.insert(kv.key).second) {
        spdlog::warn("rollpackd: etcd key {} {}; not counted as a member", kv.key, problem);
      }
      continue;
    }
    members.push_back({std::move(id), std::move(address)});
  }
  return members;
}

int Cluster::last_member_count() const {
  absl::MutexLock lock(&mu_);
  return last_member_count_;
}

absl::StatusOr<v1::PoolInfo> Cluster::GetPoolOf(const ClusterMember& member,
                                                const std::string& pool,
                                                const std::vector<std::string>& complete_group_ids) {
  v1::GetPoolRequest request;
  request.set_pool(pool);
  request.set_local_only(true);
  for (const std::string& id : complete_group_ids) request.add_complete_group_ids(id);
  v1::PoolInfo info;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::microseconds(absl::ToInt64Microseconds(options_.etcd.timeout)));
  grpc::Status s = peers_->Rollouts(member)->GetPool(&context, request, &info);
  if (s.ok()) return info;
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    return absl::NotFoundError(s.error_message());
  }
  return absl::UnavailableError(absl::StrCat("cluster member ", member.id, " (", member.address,
                                             "): GetPool: ", s.error_message()));
}

}  // namespace rollpack
