#include "client/trainer/tp_communicator.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/trainer/cuda_check.h"
#include "client/trainer/rendezvous.h"

namespace rollpack::trainer_internal {
namespace {

// Creating a communicator costs a rendezvous and a ncclCommInitRank (tens
// to hundreds of milliseconds) per step, and destroying it more; reusing one
// costs two small Rendezvous calls. Keyed on what fixes the group from this
// rank's side; whether the peers still hold the same communicator is
// settled by the handshake in ConnectTpGroup, never assumed.
struct TpCommKey {
  int device, dp, cp, pp, size, rank;
  bool operator<(const TpCommKey& o) const {
    return std::tie(device, dp, cp, pp, size, rank) <
           std::tie(o.device, o.dp, o.cp, o.pp, o.size, o.rank);
  }
};

TpCommKey KeyOf(const v1::RankCoords& rank, const DeviceStreamOptions& o) {
  return TpCommKey{o.device, rank.dp(), rank.cp(), rank.pp(), o.tp_leader_size, rank.tp()};
}

struct TpComm {
  ncclComm_t comm = nullptr;
  std::string generation;
};

// Leaked on purpose: at exit NCCL and the CUDA runtime may already be torn
// down.
class TpCommCache {
 public:
  static TpCommCache& Get() {
    static TpCommCache* cache = new TpCommCache();
    return *cache;
  }

  // The idle communicator of `key`, removed from the cache (comm = nullptr if none).
  TpComm Take(const TpCommKey& key) {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find(key);
    if (it == idle_.end()) return {};
    TpComm c = std::move(it->second.comm);
    idle_.erase(it);
    return c;
  }

  // Keeps `c` idle under `key`; an older idle one of the key is aborted.
  void Put(const TpCommKey& key, TpComm c, const Nccl* nccl) {
    TpComm old;
    {
      absl::MutexLock lock(&mu_);
      Entry& e = idle_[key];
      old = std::exchange(e.comm, std::move(c));
      e.nccl = nccl;
    }
    if (old.comm != nullptr) nccl->CommAbort(old.comm);
  }

  // Abort, not destroy, because destroying may wait for the peers, which
  // need not be closing at the same time; an idle communicator has no work
  // left to lose.
  void CloseAll() {
    std::map<TpCommKey, Entry> all;
    {
      absl::MutexLock lock(&mu_);
      all.swap(idle_);
    }
    for (auto& [key, e] : all) {
      DeviceGuard g(key.device);
      e.nccl->CommAbort(e.comm.comm);
    }
  }

 private:
  struct Entry {
    TpComm comm;
    const Nccl* nccl = nullptr;
  };
  absl::Mutex mu_;
  std::map<TpCommKey, Entry> idle_ ABSL_GUARDED_BY(mu_);
};

std::string NewGeneration() {
  static std::mutex mu;
  static std::mt19937_64 rng = [] {
    std::random_device rd;
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    std::seed_seq seq{rd(), rd(), rd(), rd(), static_cast<unsigned>(now),
                      static_cast<unsigned>(getpid())};
    return std::mt19937_64(seq);
  }();
  std::lock_guard<std::mutex> lock(mu);
  return absl::StrCat(absl::Hex(rng(), absl::kZeroPad16), absl::Hex(rng(), absl::kZeroPad16));
}

bool EnvFlag(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return dflt;
  return !(std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "off") == 0);
}

// Through rollpackd, under the step's key K: each follower posts the
// generation of the communicator it holds idle for this group ("" if none)
// under K/have<tp>; the leader, once it has them all, posts "R<generation>"
// (reuse: all equal its own) or "N<generation><ncclUniqueId>" (a new
// communicator, created by everyone) under K. The decision is the leader's
// alone and every rank follows it, so the ranks cannot disagree; a rank that
// holds a communicator that is not chosen aborts it. Either way the step
// costs a few small Rendezvous calls; creating a communicator adds
// ncclCommInitRank.
absl::Status Handshake(const Nccl& nccl, const std::shared_ptr<grpc::Channel>& channel,
                       const std::string& step_id, const v1::RankCoords& rank,
                       const DeviceStreamOptions& options, TpGroupComm* out) {
  const int size = options.tp_leader_size;
  const bool leader = rank.tp() == 0;
  const std::string key = absl::StrCat(step_id, "/tp-leader/dp", rank.dp(), "/cp", rank.cp(),
                                       "/pp", rank.pp(), "/start", options.start_index,
                                       "/tag", options.rendezvous_tag);
  out->keep = options.reuse_tp_communicator && EnvFlag("ROLLPACK_TP_COMM_REUSE", true);
  TpComm mine = out->keep ? TpCommCache::Get().Take(KeyOf(rank, options)) : TpComm{};
  auto drop_mine = [&] {
    if (mine.comm != nullptr) {
      DeviceGuard g(options.device);
      nccl.CommAbort(mine.comm);
      mine.comm = nullptr;
    }
  };
  ncclUniqueId id;
  std::string decision;
  if (leader) {
    bool all_same = mine.comm != nullptr;
    for (int t = 1; t < size; ++t) {
      absl::StatusOr<std::string> have =
          RendezvousWait(channel, absl::StrCat(key, "/have", t), options.rendezvous_timeout_s,
                         options.auth_token);
      if (!have.ok()) {
        drop_mine();
        return have.status();
      }
      all_same = all_same && *have == mine.generation;
    }
    if (all_same) {
      decision = "R" + mine.generation;
    } else {
      drop_mine();
      RP_NCCL(nccl.GetUniqueId(&id));
      decision = absl::StrCat("N", NewGeneration(), std::string(id.internal, sizeof(id)));
    }
    if (absl::Status s = RendezvousPost(channel, key, decision, options.auth_token); !s.ok()) {
      drop_mine();
      return s;
    }
  } else {
    if (absl::Status s = RendezvousPost(channel, absl::StrCat(key, "/have", rank.tp()),
                                        mine.comm != nullptr ? mine.generation : std::string(),
                                        options.auth_token);
        !s.ok()) {
      drop_mine();
      return s;
    }
    absl::StatusOr<std::string> v =
        RendezvousWait(channel, key, options.rendezvous_timeout_s, options.auth_token);
    if (!v.ok()) {
      drop_mine();
      return v.status();
    }
    decision = std::move(*v);
  }
  constexpr size_t kGen = 32;
  if (decision.size() == 1 + kGen && decision[0] == 'R') {
    if (mine.comm == nullptr || decision.compare(1, kGen, mine.generation) != 0) {
      drop_mine();
      return absl::DataLossError("TP leader reuses a communicator this rank does not hold");
    }
    out->comm = mine.comm;
    out->generation = mine.generation;
    out->reused = true;
    return absl::OkStatus();
  }
  if (decision.size() != 1 + kGen + sizeof(id) || decision[0] != 'N') {
    drop_mine();
    return absl::DataLossError("bad TP-leader rendezvous value (mixed rollpack versions?)");
  }
  drop_mine();
  out->generation = decision.substr(1, kGen);
  std::memcpy(id.internal, decision.data() + 1 + kGen, sizeof(id));
  DeviceGuard g(options.device);
  RP_NCCL(nccl.CommInitRank(&out->comm, size, id, rank.tp()));
  out->reused = false;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TpGroupComm> ConnectTpGroup(const Nccl& nccl,
                                           const std::shared_ptr<grpc::Channel>& channel,
                                           const std::string& step_id, const v1::RankCoords& rank,
                                           const DeviceStreamOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  TpGroupComm c;
  if (absl::Status s = Handshake(nccl, channel, step_id, rank, options, &c); !s.ok()) return s;
  if (EnvFlag("ROLLPACK_TP_COMM_LOG", false)) {
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - t0;
    std::fprintf(stderr,
                 "rollpack tp-leader %s dp%d cp%d pp%d tp%d: %s communicator %s in %.1f ms\n",
                 step_id.c_str(), rank.dp(), rank.cp(), rank.pp(), rank.tp(),
                 c.reused ? "reused" : "created", c.generation.c_str(), took.count());
  }
  return c;
}

void FinishTpGroup(const Nccl& nccl, const v1::RankCoords& rank,
                   const DeviceStreamOptions& options, TpGroupComm comm, bool clean) {
  if (comm.comm == nullptr) return;
  DeviceGuard g(options.device);
  if (clean && comm.keep) {
    TpCommCache::Get().Put(KeyOf(rank, options), TpComm{comm.comm, std::move(comm.generation)},
                           &nccl);
  } else if (clean) {
    nccl.CommDestroy(comm.comm);  // every rank reached the end together
  } else {
    nccl.CommAbort(comm.comm);
  }
}

void CloseIdleTpComms() { TpCommCache::Get().CloseAll(); }

}  // namespace rollpack::trainer_internal
