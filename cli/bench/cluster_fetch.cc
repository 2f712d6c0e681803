#include "cli/bench/cluster_fetch.h"

#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/keep_freed_memory.h"
#include "base/status_macros.h"
#include "cli/bench/cleanup.h"
#include "cli/bench/cluster_members.h"
#include "cli/bench/links.h"
#include "cli/bench/support.h"
#include "cli/flags.h"
#include "client/cpp/client.h"
#include "client/cpp/delivery_mode.h"
#include "client/cpp/received_microbatch.h"
#include "client/cpp/trainer_stream.h"
#include "proto/wire/deterministic_bytes.h"
#include "testing/etcd_process.h"
#include "testing/synthetic_rollouts.h"

namespace rollpack {
namespace {

constexpr char kPool[] = "pool";

const char* DeliveryName(Delivery d) { return d == Delivery::kDirect ? "direct" : "proxy"; }

struct FetchBenchConfig {
  std::string mode = "fetch";
  std::vector<std::string> members = {"1", "2", "4"};

  std::vector<std::string> deliveries = {"direct", "proxy"};
  int ranks = 64;
  int cp = 1;
  // A Qwen3-30B-A3B-shaped payload (48 MoE layers, top-8: 384 replay
  // bytes a token) in rollouts of RL length: micro-batches of tens of MB,
  // as a trainer rank receives, not the kilobytes whose per-message costs
  // would be measured instead.
  int samples = 2048;
  double median_length = 2048;
  int64_t max_length = 16384;
  int64_t max_tokens_per_rank = 32768;
  int rounds = 3;
  // How producers spread samples over the members: "round-robin" by count,
  // or "least-tokens" (each to the member holding the fewest tokens so far,
  // as a least-loaded request router spreads rollouts over engines).
  std::string placement = "round-robin";
  double link_gbps = 0;
  std::string rollpackd;
};

v1::ModelSpec FetchModel() {
  v1::ModelSpec m;
  m.set_name("Qwen3-30B-A3B");
  m.set_num_layers(48);
  m.set_num_experts(128);
  m.set_topk(8);
  return m;
}

double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

int64_t SelfMinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// The member each sample goes to: i % M (round-robin), or the member with
// the fewest tokens so far, the lowest index on ties (least-tokens).
std::vector<int> Placement(const std::string& placement, int members,
                           const std::vector<v1::Sample>& samples) {
  std::vector<int> owner(samples.size());
  std::vector<int64_t> tokens(static_cast<size_t>(members), 0);
  for (size_t k = 0; k < samples.size(); ++k) {
    int to = static_cast<int>(k % static_cast<size_t>(members));
    if (placement == "least-tokens") {
      to = static_cast<int>(std::min_element(tokens.begin(), tokens.end()) - tokens.begin());
    }
    owner[k] = to;
    tokens[static_cast<size_t>(to)] += samples[k].tokens().shape(0);
  }
  return owner;
}

// Each member's samples (owner[k] == i) to member i, all members at once.
absl::Status PutSpread(const std::vector<BenchMember>& members, const std::vector<v1::Sample>& samples,
                       const std::vector<int>& owner) {
  const size_t m = members.size();
  std::vector<absl::Status> errors(m);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < m; ++i) {
    threads.emplace_back([&, i] {
      std::vector<v1::Sample> own;
      for (size_t k = 0; k < samples.size(); ++k) {
        if (owner[k] == static_cast<int>(i)) own.push_back(samples[k]);
      }
      if (own.empty()) return;
      RollpackClient client(members[i].address);
      absl::StatusOr<v1::PutSamplesResponse> put = client.PutSamples(kPool, own);
      if (!put.ok()) {
        errors[i] = absl::Status(put.status().code(),
                                 absl::StrCat("PutSamples to member ", members[i].address, ": ",
                                              put.status().message()));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : errors) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// Every member in the member list, as seen through member 0.
absl::Status AwaitMembers(const std::vector<BenchMember>& members) {
  RollpackClient client(members[0].address);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  int seen = 0;
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::PoolInfo> pool = client.GetPool(kPool);
    if (pool.ok()) {
      seen = pool->members_size();
      if (seen == static_cast<int>(members.size())) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "GetPool through ", members[0].address, " lists ", seen, " members after 30 s, not ",
      members.size()));
}

uint64_t Fnv1a(uint64_t h, const std::string& bytes) {
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

struct FetchResult {
  double wall_seconds = 0;
  double client_cpu_seconds = 0;
  int64_t client_minor_faults = 0;
  int64_t bytes = 0;  // serialized micro-batches, all ranks
  // Per rank: a hash of its micro-batches' deterministic bytes, step_id
  // cleared (every fetch is of a step of its own).
  std::vector<uint64_t> digests;
};

// Every rank of `topology` at once, one thread each, rank r through member
// r % M. Connections are made before the clock starts (a trainer process
// keeps its channels from step to step), then `on_connected` runs: the
// members' counters are read there, so connecting counts in neither.
absl::StatusOr<FetchResult> FetchAllRanks(Delivery delivery, const std::vector<BenchMember>& members,
                                          const std::string& step_id,
                                          const v1::Topology& topology,
                                          const std::function<absl::Status()>& on_connected) {
  const int m = static_cast<int>(members.size());
  const std::vector<v1::RankCoords> ranks = AllRanks(topology);
  // Per rank, a connection of its own to each member it reads from, as
  // separate trainer processes have: [rank][member].
  std::vector<std::vector<std::shared_ptr<grpc::Channel>>> channels(ranks.size());
  const absl::Time connect_deadline = absl::Now() + absl::Seconds(30);
  for (size_t r = 0; r < ranks.size(); ++r) {
    channels[r].resize(m);
    for (int i = 0; i < m; ++i) {
      if (delivery == Delivery::kProxy && i != static_cast<int>(r % m)) continue;
      channels[r][i] = MakeDistinctChannel(members[i].address);
      if (!channels[r][i]->WaitForConnected(absl::ToChronoTime(connect_deadline))) {
        return absl::UnavailableError(absl::StrCat("rank ", r, ": no connection to member ",
                                                   members[i].address, " in 30 s"));
      }
    }
  }
  RETURN_IF_ERROR(on_connected());
  std::vector<std::vector<ReceivedMicrobatch>> received(ranks.size());
  std::vector<absl::Status> errors(ranks.size());
  const double cpu_before = SelfCpuSeconds();
  const int64_t faults_before = SelfMinorFaults();
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      TrainerStreamOptions options;
      options.delivery = delivery;
      // The connections made above; MemberChannel keeps each for the
      // stream's life.
      options.member_channel = [&, r](const std::string& address) {
        for (int i = 0; i < m; ++i) {
          if (members[i].address == address && channels[r][i] != nullptr) return channels[r][i];
        }
        return MakeDistinctChannel(address);
      };
      TrainerStream stream(channels[r][r % m], step_id, ranks[r], options);
      while (true) {
        absl::StatusOr<std::optional<ReceivedMicrobatch>> mb = stream.NextReceived();
        if (!mb.ok()) {
          errors[r] = mb.status();
          return;
        }
        if (!mb->has_value()) return;
        received[r].push_back(**std::move(mb));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  FetchResult result;
  result.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  result.client_cpu_seconds = SelfCpuSeconds() - cpu_before;
  result.client_minor_faults = SelfMinorFaults() - faults_before;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!errors[r].ok()) {
      return absl::Status(errors[r].code(),
                          absl::StrCat(DeliveryName(delivery), " fetch of rank ", r,
                                       " through ", members[r % m].address, ": ",
                                       errors[r].message()));
    }
  }
  result.digests.resize(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    uint64_t h = 14695981039346656037ull;
    for (const ReceivedMicrobatch& mb : received[r]) {
      v1::Microbatch message = mb.ToMessage();
      result.bytes += static_cast<int64_t>(message.ByteSizeLong());
      message.clear_step_id();
      h = Fnv1a(h, DeterministicBytes(message));
    }
    result.digests[r] = h;
  }
  return result;
}

// One measurement: one (M, delivery, round).
struct Measurement {
  double wall_seconds = 0;
  double gbytes = 0;
  double gbytes_per_second = 0;
  double pulled_mbytes = 0;
  double cpu_per_gb_mean = 0;  // member CPU s per GB it wrote to trainer streams
  double cpu_per_gb_max = 0;
  double client_cpu_per_gb = 0;
  // Bytes the busiest member wrote to trainer streams / the members' mean:
  // over links, the aggregate is at most M x rate / this.
  double busiest = 0;
  // Bytes all members wrote to trainer streams (pieces: their own framing).
  double served_gbytes = 0;
  // Minor page faults per MB fetched: the members' (all of them) and the
  // ranks' process; what the first round pays for fresh memory shows here.
  double member_faults_per_mb = 0;
  double client_faults_per_mb = 0;
};

struct Row {
  int members = 0;
  Delivery delivery = Delivery::kProxy;
  std::vector<Measurement> rounds;
  bool identical = true;
};

template <typename Field>
double MedianOf(const std::vector<Measurement>& v, Field field) {
  std::vector<double> x;
  for (const Measurement& m : v) x.push_back(m.*field);
  return Median(x);
}

// The first round of a run against its steady state: the median GB/s of the
// rounds from the 4th on (from the 2nd with fewer rounds; 0 with one), as
// a training run sees it after its first steps.
constexpr size_t kSteadyFromRound = 3;  // 0-based: the 4th
double SteadyGbps(const std::vector<Measurement>& rounds) {
  if (rounds.size() < 2) return 0;
  const size_t from = rounds.size() > kSteadyFromRound ? kSteadyFromRound : 1;
  std::vector<double> x;
  for (size_t r = from; r < rounds.size(); ++r) x.push_back(rounds[r].gbytes_per_second);
  return Median(x);
}

// Put, step, fetch, release: one measurement.
absl::StatusOr<Measurement> MeasureOnce(Delivery delivery, BenchCluster& cluster,
                                        const std::vector<v1::Sample>& samples,
                                        const std::vector<int>& owner,
                                        const v1::Topology& topology, const std::string& step_id,
                                        std::vector<uint64_t>* reference, bool* identical) {
  std::vector<BenchMember>& members = cluster.members();
  RETURN_IF_ERROR(PutSpread(members, samples, owner));
  RollpackClient coordinator(members[0].address);
  v1::CreateStepRequest request;
  request.set_step_id(step_id);
  request.set_pool(kPool);
  // Explicit ids in one order: the same plan, so the same bytes, for every
  // M and delivery (num_samples would order by arrival).
  for (const v1::Sample& sample : samples) request.add_sample_ids(sample.sample_id());
  *request.mutable_topology() = topology;
  if (absl::StatusOr<v1::StepInfo> info = coordinator.CreateStep(request); !info.ok()) {
    return absl::Status(info.status().code(),
                        absl::StrCat("CreateStep ", step_id, ": ", info.status().message()));
  }
  std::vector<MemberCounters> before;
  auto read_before = [&]() -> absl::Status {
    for (const BenchMember& m : members) {
      ASSIGN_OR_RETURN(MemberCounters c, ReadCounters(m));
      before.push_back(c);
    }
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(FetchResult fetched,
                   FetchAllRanks(delivery, members, step_id, topology, read_before));
  Measurement out;
  double cpu_sum = 0, served_sum = 0, served_max = 0;
  int64_t member_faults = 0;
  int serving = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    ASSIGN_OR_RETURN(MemberCounters after, ReadCounters(members[i]));
    member_faults += after.minor_faults - before[i].minor_faults;
    out.pulled_mbytes += (after.pulled_bytes - before[i].pulled_bytes) / 1e6;
    const double served_gb = (after.streamed_bytes - before[i].streamed_bytes) / 1e9;
    served_sum += served_gb;
    served_max = std::max(served_max, served_gb);
    if (served_gb <= 0) continue;  // no rank of it (fewer ranks than members)
    const double per_gb = (after.cpu_seconds - before[i].cpu_seconds) / served_gb;
    cpu_sum += per_gb;
    ++serving;
    out.cpu_per_gb_max = std::max(out.cpu_per_gb_max, per_gb);
  }
  out.cpu_per_gb_mean = serving > 0 ? cpu_sum / serving : 0;
  out.busiest = served_sum > 0 ? served_max / (served_sum / members.size()) : 0;
  out.served_gbytes = served_sum;
  out.wall_seconds = fetched.wall_seconds;
  out.gbytes = static_cast<double>(fetched.bytes) / 1e9;
  out.gbytes_per_second = out.gbytes / fetched.wall_seconds;
  out.client_cpu_per_gb = fetched.client_cpu_seconds / out.gbytes;
  out.member_faults_per_mb = member_faults / (out.gbytes * 1e3);
  out.client_faults_per_mb = fetched.client_minor_faults / (out.gbytes * 1e3);
  if (reference->empty()) *reference = fetched.digests;
  for (size_t r = 0; r < fetched.digests.size(); ++r) {
    if (fetched.digests[r] != (*reference)[r]) {
      std::fprintf(stderr, "rollpack bench cluster: step %s: rank %zu's bytes (%s) differ\n",
                   step_id.c_str(), r, DeliveryName(delivery));
      *identical = false;
    }
  }
  if (absl::StatusOr<v1::ReleaseStepResponse> released = coordinator.ReleaseStep(step_id);
      !released.ok()) {
    return absl::Status(released.status().code(),
                        absl::StrCat("ReleaseStep ", step_id, ": ", released.status().message()));
  }
  return out;
}

// The run with everything it starts; errors name what failed.
absl::StatusOr<std::vector<Row>> Run(const FetchBenchConfig& config,
                                     const std::vector<int>& member_counts,
                                     const std::vector<Delivery>& deliveries,
                                     const std::string& dir) {
  std::unique_ptr<MemberLinks> links;
  const int most = *std::max_element(member_counts.begin(), member_counts.end());
  EtcdProcessOptions etcd_options;
  if (config.link_gbps > 0) {
    ASSIGN_OR_RETURN(links, MemberLinks::Create(most, config.link_gbps));
    // Members reach etcd at the host's end of member 0's link.
    etcd_options.client_listen_host = "0.0.0.0";
    etcd_options.client_advertise_host = links->host_ip(0);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdProcess> etcd, EtcdProcess::Start(1, etcd_options));
  EtcdProcess* raw_etcd = etcd.get();
  // Declared after `etcd`: removed before it is destroyed, on every return.
  const ScopedCleanupAction etcd_cleanup([raw_etcd] {
    raw_etcd->Stop();
    std::filesystem::remove_all(raw_etcd->dir());
  });

  SyntheticOptions synthetic;
  synthetic.num_samples = config.samples;
  synthetic.median_length = config.median_length;
  synthetic.max_length = config.max_length;
  synthetic.mixed_forms = false;
  // What a narrowing producer sends: the micro-batches are the same, and
  // putting the samples (each round, over the links) costs a quarter.
  synthetic.narrow_when_uniform = true;
  const std::vector<v1::Sample> samples = MakeSyntheticRollouts(FetchModel(), synthetic);
  v1::Topology topology;
  topology.set_dp(config.ranks);
  topology.set_cp(config.cp);
  topology.set_max_tokens_per_rank(config.max_tokens_per_rank);
  if (config.cp > 1) topology.set_scheduler(v1::DYNAMIC_CP);

  std::vector<Row> rows;
  std::vector<uint64_t> reference;
  for (const int m : member_counts) {
    ASSIGN_OR_RETURN(std::unique_ptr<BenchCluster> cluster,
                     BenchCluster::Start(m, links.get(), etcd->client_url(),
                                         config.rollpackd, dir));
    RollpackClient coordinator(cluster->members()[0].address);
    if (absl::StatusOr<bool> r = coordinator.RegisterModel(kPool, FetchModel()); !r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat("RegisterModel: ", r.status().message()));
    }
    RETURN_IF_ERROR(AwaitMembers(cluster->members()));
    const std::vector<int> owner = Placement(config.placement, m, samples);
    const size_t first = rows.size();
    for (Delivery d : deliveries) rows.push_back({m, d, {}, true});
    for (int round = 0; round < config.rounds; ++round) {
      // Alternate which delivery goes first: the machine's state drifts.
      for (size_t k = 0; k < deliveries.size(); ++k) {
        const size_t which = (k + round) % deliveries.size();
        Row& row = rows[first + which];
        const std::string step_id =
            absl::StrCat("fetch-m", m, "-r", round, "-", DeliveryName(row.delivery));
        ASSIGN_OR_RETURN(Measurement one,
                         MeasureOnce(row.delivery, *cluster, samples, owner, topology, step_id,
                                     &reference, &row.identical));
        std::fprintf(stderr,
                     "  M=%d %-6s round %d: %.3f GB in %.3f s, %.3f GB/s; minor faults per MB: "
                     "members %.1f, ranks %.1f\n",
                     m, DeliveryName(row.delivery), round + 1, one.gbytes, one.wall_seconds,
                     one.gbytes_per_second, one.member_faults_per_mb, one.client_faults_per_mb);
        row.rounds.push_back(one);
      }
    }
  }
  return rows;
}

}  // namespace

int RunBenchClusterFetchCommand(int argc, char** argv) {
  FetchBenchConfig config;
  FlagSet flags(
      "rollpack bench cluster --mode fetch",
      "Direct pulls against proxy delivery (issue 19): for each M of --members, an etcd and M "
      "rollpackd members as child processes, each holding its share of the samples "
      "(--placement), a step over all of them, and every rank (dp x cp, one thread each) "
      "fetching at once through member rank % M: direct (pieces from every owner) and proxy "
      "(that member pulls the others' samples and streams whole micro-batches). Reports "
      "aggregate GB/s, bytes pulled between members and member CPU per GB served; exit 1 when "
      "a rank's bytes differ between deliveries. --link-gbps puts each member in a network "
      "namespace behind a link of that rate (needs root). Needs /usr/bin/etcd.");
  flags.String("mode", &config.mode, "fetch here; plan: the planning benchmark.");
  flags.List("members", &config.members, "Member counts, one row set each.");
  flags.List("delivery", &config.deliveries, "Deliveries to compare: direct, proxy.");
  flags.Int("ranks", &config.ranks, "Data-parallel ranks (dp) of the step.").Min(1);
  flags.Int("cp", &config.cp, "Context-parallel ranks of the step (dynamic CP when > 1).")
      .Min(1);
  flags.Int("samples", &config.samples, "Samples in the step, spread by --placement.").Min(1);
  flags.String("placement", &config.placement,
               "round-robin (sample k on member k % M) or least-tokens (each sample on the "
               "member holding the fewest tokens so far, as a least-loaded router places "
               "rollouts).");
  flags.Double("median-length", &config.median_length, "Median rollout length, tokens.");
  flags.Int64("max-length", &config.max_length, "Longest rollout, tokens.").Min(1);
  flags.Int64("max-tokens-per-rank", &config.max_tokens_per_rank, "Per-rank token budget.")
      .Min(1);
  flags.Int("rounds", &config.rounds,
            "Rounds per M; each fetches a fresh step per delivery. Round 1 is reported apart "
            "from the steady state (the median of rounds 4 on; of rounds 2 on with fewer).")
      .Min(1);
  flags.Double("link-gbps", &config.link_gbps,
               "Each member's link, GB/s (bytes) each way; 0 = no namespaces, all on "
               "127.0.0.1.");
  flags.String("rollpackd", &config.rollpackd,
               "rollpackd binary; empty: the one next to this program.");
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  if (config.mode != "fetch") {
    return flags.UsageError(absl::StrCat("--mode \"", config.mode, "\": want plan or fetch"));
  }
  std::vector<int> member_counts;
  for (const std::string& text : config.members) {
    int m = 0;
    if (!absl::SimpleAtoi(text, &m) || m < 1) {
      return flags.UsageError(absl::StrCat("--members \"", text, "\": want integers >= 1"));
    }
    member_counts.push_back(m);
  }
  std::vector<Delivery> deliveries;
  for (const std::string& text : config.deliveries) {
    if (text != "direct" && text != "proxy") {
      return flags.UsageError(absl::StrCat("--delivery \"", text, "\": want direct or proxy"));
    }
    deliveries.push_back(text == "direct" ? Delivery::kDirect : Delivery::kProxy);
  }
  if (member_counts.empty() || deliveries.empty()) {
    return flags.UsageError("--members and --delivery need at least one value");
  }
  if (config.placement != "round-robin" && config.placement != "least-tokens") {
    return flags.UsageError(absl::StrCat("--placement \"", config.placement,
                                         "\": want round-robin or least-tokens"));
  }
  if (config.link_gbps < 0) {
    return flags.UsageError(absl::StrCat("--link-gbps ", config.link_gbps, ": want >= 0"));
  }
  if (config.rollpackd.empty()) config.rollpackd = SelfDir() + "/rollpackd";
  if (access(config.rollpackd.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "rollpack bench cluster: no rollpackd at %s (--rollpackd)\n",
                 config.rollpackd.c_str());
    return 1;
  }

  // Before any thread exists: children, namespaces and files go on any exit.
  CatchTerminatingSignals();
  std::string dir = (std::filesystem::temp_directory_path() / "rollpack-fetch-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    std::fprintf(stderr, "rollpack bench cluster: mkdtemp %s failed\n", dir.c_str());
    return 1;
  }
  const int dir_cleanup = AddCleanupAction([dir] { std::filesystem::remove_all(dir); });
  // This process is the ranks' trainer processes: started with the malloc
  // settings docs/trainer.md asks a launcher for ("The first step"), before
  // it allocates its samples. Applied at the first stream instead, round 1
  // stayed at 0.53-0.60 of the steady state on the 16-core host.
  KeepReceivedMemory();
  absl::StatusOr<std::vector<Row>> rows = Run(config, member_counts, deliveries, dir);
  std::filesystem::remove_all(dir);
  RemoveCleanupAction(dir_cleanup);
  if (!rows.ok()) {
    std::fprintf(stderr, "rollpack bench cluster: %s\n", rows.status().ToString().c_str());
    return 1;
  }

  const bool links = config.link_gbps > 0;
  std::printf("rollpack bench cluster --mode fetch: %d samples (median %.0f tokens) placed "
              "%s, dp=%d cp=%d, %s, %d rounds (medians; round 1 and the steady state, the "
              "median of rounds 4 on, apart)\n\n",
              config.samples, config.median_length, config.placement.c_str(), config.ranks,
              config.cp,
              links ? absl::StrFormat("each member behind a %.3g GB/s link", config.link_gbps)
                          .c_str()
                    : "all on 127.0.0.1, no link limit",
              config.rounds);
  std::printf("%7s  %-8s %8s %8s %8s %8s %8s %8s %8s %10s %12s %12s %12s %9s\n", "members",
              "delivery", "GB", "wall s", "GB/s", "round 1", "steady", "x links", "busiest",
              "pulled MB", "CPU s/GB avg", "CPU s/GB max", "client s/GB", "identical");
  bool ok = true;
  std::vector<std::string> json_rows;
  for (const Row& row : *rows) {
    const double gbps = MedianOf(row.rounds, &Measurement::gbytes_per_second);
    const double of_links = links ? gbps / (row.members * config.link_gbps) : 0;
    const double pulled = MedianOf(row.rounds, &Measurement::pulled_mbytes);
    const double cpu_mean = MedianOf(row.rounds, &Measurement::cpu_per_gb_mean);
    const double cpu_max = MedianOf(row.rounds, &Measurement::cpu_per_gb_max);
    const double client = MedianOf(row.rounds, &Measurement::client_cpu_per_gb);
    const double wall = MedianOf(row.rounds, &Measurement::wall_seconds);
    const double gbytes = MedianOf(row.rounds, &Measurement::gbytes);
    const double busiest = MedianOf(row.rounds, &Measurement::busiest);
    const double served = MedianOf(row.rounds, &Measurement::served_gbytes);
    const double first_round = row.rounds.front().gbytes_per_second;
    const double steady = SteadyGbps(row.rounds);
    std::vector<std::string> each_round, member_faults, client_faults;
    for (const Measurement& m : row.rounds) {
      each_round.push_back(absl::StrFormat("%.4f", m.gbytes_per_second));
      member_faults.push_back(absl::StrFormat("%.1f", m.member_faults_per_mb));
      client_faults.push_back(absl::StrFormat("%.1f", m.client_faults_per_mb));
    }
    double most_pulled = 0;
    for (const Measurement& m : row.rounds) most_pulled = std::max(most_pulled, m.pulled_mbytes);
    // Direct pulls must not move sample bytes between members at all.
    const bool pulled_ok = row.delivery != Delivery::kDirect || most_pulled == 0;
    ok = ok && row.identical && pulled_ok;
    std::printf("%7d  %-8s %8.3f %8.3f %8.3f %8.3f %8s %8s %8.2f %10.1f %12.2f %12.2f %12.2f %9s\n",
                row.members, DeliveryName(row.delivery), gbytes, wall, gbps, first_round,
                steady > 0 ? absl::StrFormat("%.3f", steady).c_str() : "-",
                links ? absl::StrFormat("%.2f", of_links).c_str() : "-", busiest, pulled,
                cpu_mean, cpu_max, client, row.identical ? "yes" : "NO");
    if (steady > 0) {
      std::printf("         round 1 = %.2f x steady; rounds: %s GB/s\n", first_round / steady,
                  absl::StrJoin(each_round, ", ").c_str());
    }
    if (!pulled_ok) {
      std::printf("         ^ direct pulls moved %.1f MB between members: expected none\n",
                  most_pulled);
    }
    json_rows.push_back(absl::StrFormat(
        "{\"members\": %d, \"delivery\": \"%s\", \"gbytes\": %.4f, \"wall_s\": %.4f, "
        "\"gbytes_per_s\": %.4f, \"of_links\": %.4f, \"busiest\": %.3f, "
        "\"served_gbytes\": %.4f, \"pulled_mbytes\": %.2f, "
        "\"member_cpu_s_per_gb_mean\": %.3f, \"member_cpu_s_per_gb_max\": %.3f, "
        "\"client_cpu_s_per_gb\": %.3f, \"identical\": %s, "
        "\"round1_gbytes_per_s\": %.4f, \"steady_gbytes_per_s\": %.4f, "
        "\"round1_over_steady\": %.4f, \"rounds_gbytes_per_s\": [%s], "
        "\"rounds_member_faults_per_mb\": [%s], \"rounds_client_faults_per_mb\": [%s]}",
        row.members, DeliveryName(row.delivery), gbytes, wall, gbps, of_links, busiest, served,
        pulled,
        cpu_mean, cpu_max, client, row.identical ? "true" : "false", first_round, steady,
        steady > 0 ? first_round / steady : 0, absl::StrJoin(each_round, ", "),
        absl::StrJoin(member_faults, ", "), absl::StrJoin(client_faults, ", ")));
  }
  std::printf(
      "\nJSON:\n%s\n",
      absl::StrFormat("{\"mode\": \"fetch\", \"samples\": %d, \"placement\": \"%s\", "
                      "\"dp\": %d, \"cp\": %d, "
                      "\"rounds\": %d, \"link_gbps\": %.4f, \"cores\": %d, \"rows\": [%s]}",
                      config.samples, config.placement.c_str(), config.ranks, config.cp,
                      config.rounds, config.link_gbps,
                      static_cast<int>(std::thread::hardware_concurrency()),
                      absl::StrJoin(json_rows, ", "))
          .c_str());
  return ok ? 0 : 1;
}

}  // namespace rollpack
