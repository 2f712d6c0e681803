#include "server/cluster/cluster_steps.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "grpcpp/client_context.h"
#include "proto/wire/deterministic_bytes.h"
#include "server/cluster/peer_calls.h"
#include "server/cluster/stall_watch.h"
#include "server/cluster/step_record.h"
#include "server/store/convert.h"
#include "server/store/log_records.h"
#include "server/store/names.h"
#include "server/store/step_builder.h"
#include "server/store/step_request_validation.h"
#include "spdlog/spdlog.h"

namespace rollpack {
namespace {

absl::Status Abandoned(const std::string& step_id, const std::string& by) {
  return absl::AbortedError(absl::StrCat(
      "step \"", step_id, "\": ", by.empty() ? "a member" : "member " + by,
      " gave up waiting for an earlier attempt at this id to be committed; the id is refused "
      "for a while (docs/cluster.md), retry under another"));
}

// The step's sequences the rank at `coords` receives, ascending.
absl::StatusOr<std::vector<int>> RankSequences(const Step& step, const RankCoords& coords) {
  std::vector<int> sequences;
  RankMicrobatchLayout rank;
  for (int mb = 0; mb < step.layout.num_microbatches(); ++mb) {
    RETURN_IF_ERROR(step.layout.Describe(coords, mb, &rank));
    sequences.insert(sequences.end(), rank.group->sequences.begin(), rank.group->sequences.end());
  }
  std::sort(sequences.begin(), sequences.end());
  sequences.erase(std::unique(sequences.begin(), sequences.end()), sequences.end());
  return sequences;
}

absl::Status Prefixed(const std::string& step_id, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("step \"", step_id, "\": ", status.message()));
}

}  // namespace

ClusterSteps::ClusterSteps(SampleStore* store, ClusterStepsOptions options)
    : store_(store), options_(options), uploads_(store) {}

ClusterSteps::~ClusterSteps() { Detach(); }

void ClusterSteps::Attach(Cluster* cluster) {
  cluster_.store(cluster);
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
  }
  background_ = std::thread([this] { BackgroundLoop(); });
}

void ClusterSteps::Detach() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (background_.joinable()) background_.join();
  cluster_.store(nullptr);
}

absl::StatusOr<Cluster*> ClusterSteps::Joined() const {
  Cluster* cluster = cluster_.load();
  if (cluster == nullptr) return absl::UnavailableError("this member is not in its cluster");
  return cluster;
}

std::string ClusterSteps::StepKey(Cluster* cluster, const std::string& step_id) const {
  return cluster->Key("steps", step_id);
}

std::string ClusterSteps::ReleaseKey(Cluster* cluster, const std::string& member,
                                     const std::string& step_id) const {
  return cluster->Key("releases", absl::StrCat(member, "/", step_id));
}

absl::StatusOr<std::shared_ptr<const Step>> ClusterSteps::CreateStep(const StepRequest& request) {
  // What the request states outright is refused before any member lists.
  RETURN_IF_ERROR(ValidateStepRequest(request));
  const std::string& step_id = request.step_id;
  const std::string& pool = request.pool;
  const Topology& topology = request.topology;
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  ASSIGN_OR_RETURN(ModelSpec model, store_->GetOrAdoptModel(pool));
  // Staleness at the request's version (0: no check), under its bound or
  // the pool's, which every member holds alike.
  ASSIGN_OR_RETURN(PoolOptions pool_options, store_->GetOptions(pool));
  SelectionRequest selection = request.selection;
  if (!selection.max_staleness.has_value()) selection.max_staleness = pool_options.max_staleness;
  const std::string key = StepKey(cluster, step_id);
  ASSIGN_OR_RETURN(int64_t existing, cluster->etcd()->CreateRevision(key));
  if (existing != 0) {
    absl::StatusOr<v1::ClusterStepRecord> record = ReadRecord(cluster, step_id);
    if (absl::IsNotFound(record.status())) return Abandoned(step_id, "");
  }
  if (existing != 0 || store_->GetStep(step_id).ok()) {
    return absl::AlreadyExistsError(absl::StrCat("step \"", step_id, "\" already exists"));
  }
  ASSIGN_OR_RETURN(std::vector<ClusterMember> members, cluster->Members());
  ASSIGN_OR_RETURN(Choice choice, Choose(cluster, members, request, selection));

  absl::StatusOr<std::shared_ptr<const Step>> step =
      BuildStepFromMetadata(step_id, pool, model, topology, choice.sample_ids, choice.num_tokens,
                            choice.num_groups, request.reuse_samples, request.replay_source);
  if (!step.ok()) return Prefixed(step_id, step.status());

  v1::ClusterStepRecord record;
  record.set_step_id(step_id);
  record.set_pool(pool);
  *record.mutable_topology() = ToProto(topology);
  *record.mutable_model() = ToProto(model);
  for (const std::string& m : choice.members) record.add_members(m);
  for (const std::string& id : choice.sample_ids) record.add_sample_ids(id);
  record.mutable_num_tokens()->Assign(choice.num_tokens.begin(), choice.num_tokens.end());
  record.mutable_owner()->Assign(choice.owner.begin(), choice.owner.end());
  record.set_coordinator(cluster->self().id);
  record.set_created_unix_nanos(absl::GetCurrentTimeNanos());
  record.set_reuse_samples(request.reuse_samples);
  record.set_num_groups(choice.num_groups);
  if (request.replay_source == ReplaySourceKind::kRecompute) {
    record.set_replay_source(v1::REPLAY_SOURCE_RECOMPUTE);
  }

  // An estimator's group refusals come before any sample is held.
  RETURN_IF_ERROR(ChoiceMetadata(choice, record, nullptr, request).status());
  const absl::Time holding = absl::Now();
  HeldScalars held_scalars;
  std::vector<std::string> incarnations;
  absl::Status held = HoldAll(cluster, record, &held_scalars, &incarnations);
  // Past half the owners' grace, an owner may be settling a hold against
  // etcd already: give up rather than race it.
  if (held.ok() && absl::Now() - holding > options_.hold_grace / 2) {
    held = absl::AbortedError(absl::StrCat("holding the samples took ",
                                           absl::FormatDuration(absl::Now() - holding),
                                           "; retry"));
  }
  if (!held.ok()) {
    DropAll(cluster, record);
    return Prefixed(step_id, held);
  }
  // From the scalars as held (frozen while the step lives): a refusal gives
  // every hold back, as any other after holding.
  absl::StatusOr<StepMetadata> metadata = ChoiceMetadata(choice, record, &held_scalars, request);
  if (!metadata.ok()) {
    DropAll(cluster, record);
    return metadata.status();
  }
  SetRecordMetadata(*metadata, &record);
  for (const std::string& incarnation : incarnations) record.add_member_incarnations(incarnation);
  step = WithMetadata(**step, *std::move(metadata));
  const std::string bytes = DeterministicBytes(record);
  bool created = false;
  int64_t revision = 0;  // of the record created: what tells it from any later value
  absl::StatusOr<std::string> holder =
      cluster->etcd()->CreateIfAbsent(key, bytes, &created, /*lease=*/0, &revision);
  // A retried create whose first try committed finds this very record.
  if (holder.ok() && *holder == bytes) created = true;
  if (!holder.ok() || !created) {
    DropAll(cluster, record);
    if (absl::IsResourceExhausted(holder.status())) {
      // Past etcd's request limit: the step cannot exist; nothing is held.
      return absl::ResourceExhaustedError(absl::StrCat(
          "step \"", step_id, "\": its record (", record.sample_ids_size(), " samples) is ",
          bytes.size(), " bytes, more than etcd takes; no sample was taken (docs/cluster.md, "
          "\"Sizing\"): ", holder.status().message()));
    }
    if (!holder.ok()) return Prefixed(step_id, holder.status());
    v1::ClusterStepRecord other;
    if (other.ParseFromString(*holder) && !other.aborted_by().empty()) {
      return Abandoned(step_id, other.aborted_by());
    }
    return absl::AlreadyExistsError(absl::StrCat("step \"", step_id, "\" already exists"));
  }
  ConfirmAll(cluster, record);
  // The trainer's version, when it says one, reaches every member once the
  // step exists (a refused CreateStep changes nothing). The step stands
  // either way; a member that missed it learns it at the next report.
  if (request.selection.policy_version > 0) {
    absl::Status reported =
        SetPolicyVersion(pool, request.selection.policy_version, /*local_only=*/false).status();
    if (!reported.ok()) {
      spdlog::warn("rollpackd: step \"{}\": recording policy version {}: {}", step_id,
                   request.selection.policy_version, reported.ToString());
    }
  }
  if (revision == 0) return step;  // looked up (and cached) later
  std::shared_ptr<CachedStep> cached = NewCachedStep(revision, std::move(record), *step);
  absl::MutexLock lock(&mu_);
  cache_[step_id] = std::move(cached);
  return step;
}

std::shared_ptr<ClusterSteps::CachedStep> ClusterSteps::NewCachedStep(
    int64_t revision, v1::ClusterStepRecord record, std::shared_ptr<const Step> step) {
  auto cached = std::make_shared<CachedStep>();
  cached->revision = revision;
  cached->record = std::move(record);
  cached->step = std::move(step);
  cached->owner = std::make_shared<const std::vector<int32_t>>(cached->record.owner().begin(),
                                                               cached->record.owner().end());
  absl::MutexLock lock(&cached->mu);
  cached->samples.resize(cached->record.sample_ids_size());
  cached->routing.resize(cached->recompute() ? cached->record.sample_ids_size() : 0);
  return cached;
}

absl::StatusOr<v1::ClusterStepRecord> ClusterSteps::ReadRecord(Cluster* cluster,
                                                              const std::string& step_id,
                                                              int64_t* mod_revision) {
  const std::string key = StepKey(cluster, step_id);
  ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> entry, cluster->etcd()->GetEntry(key));
  v1::ClusterStepRecord record;
  if (entry.has_value() && !record.ParseFromString(entry->value)) {
    return absl::DataLossError(absl::StrCat("etcd key ", key, " does not hold a step record"));
  }
  if (!entry.has_value() || !record.aborted_by().empty()) {
    return absl::NotFoundError(absl::StrCat("step \"", step_id, "\" does not exist or was released"));
  }
  if (mod_revision != nullptr) *mod_revision = entry->mod_revision;
  return record;
}

absl::StatusOr<std::shared_ptr<ClusterSteps::CachedStep>> ClusterSteps::Find(
    const std::string& step_id) {
  RETURN_IF_ERROR(ValidateName("step_id", step_id, kMaxStepIdBytes));
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  std::shared_ptr<CachedStep> cached;
  {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(step_id);
    if (it != cache_.end()) cached = it->second;
  }
  absl::StatusOr<int64_t> revision = cluster->etcd()->ModRevision(StepKey(cluster, step_id));
  if (!revision.ok()) {
    // etcd away: steps this member knows keep serving.
    if (cached != nullptr) return cached;
    return revision.status();
  }
  if (*revision == 0) {
    absl::MutexLock lock(&mu_);
    cache_.erase(step_id);
    return absl::NotFoundError(absl::StrCat("step \"", step_id, "\" does not exist or was released"));
  }
  // The plan of exactly these bytes: a record put over since (by hand, or
  // forged) is read and checked again, never served from the old plan.
  if (cached != nullptr && cached->revision == *revision) return cached;
  int64_t read_at = 0;  // the revision of the bytes read (the key may change again meanwhile)
  absl::StatusOr<v1::ClusterStepRecord> record = ReadRecord(cluster, step_id, &read_at);
  absl::StatusOr<std::shared_ptr<const Step>> step =
      record.ok() ? StepFromRecord(step_id, *record) : record.status();
  if (!step.ok()) {
    // A record refused (or gone) is not this member's step any more: the
    // plan of the bytes before it is not served either.
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(step_id);
    if (it != cache_.end() && it->second->revision < std::max(*revision, read_at)) {
      cache_.erase(it);
    }
    return step.status();
  }
  cached = NewCachedStep(read_at, *std::move(record), *std::move(step));
  absl::MutexLock lock(&mu_);
  // Two first lookups racing: both get the one cached, so every caller of
  // a step shares its owner vector and samples.
  std::shared_ptr<CachedStep>& slot = cache_[step_id];
  if (slot != nullptr && slot->revision == read_at) return slot;
  // The newer of the two when lookups of two revisions race.
  if (slot != nullptr && slot->revision > read_at) return slot;
  slot = cached;
  return cached;
}

absl::StatusOr<std::shared_ptr<const Step>> ClusterSteps::GetStep(const std::string& step_id) {
  // A step made on this server before it joined a cluster (its log).
  if (absl::StatusOr<std::shared_ptr<const Step>> local = store_->GetStep(step_id); local.ok()) {
    return local;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<CachedStep> cached, Find(step_id));
  return cached->step;
}

absl::StatusOr<std::vector<LiveStep>> ClusterSteps::ListSteps(const std::string& pool) {
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  if (!pool.empty()) {
    RETURN_IF_ERROR(ValidateName("pool name", pool, kMaxPoolNameBytes));
    ASSIGN_OR_RETURN(std::optional<ModelSpec> model, cluster->LookupPool(pool));
    if (!model.has_value()) {
      return absl::NotFoundError(absl::StrCat("pool \"", pool, "\" has no registered model"));
    }
  }
  // Steps made on this server before it joined a cluster, then the cluster's.
  std::vector<LiveStep> live = store_->ListSteps(pool);
  absl::flat_hash_set<std::string> local;
  for (const LiveStep& s : live) local.insert(s.step->step_id);
  ASSIGN_OR_RETURN(auto records, cluster->etcd()->GetPrefix(StepKey(cluster, "")));
  for (const auto& [key, value] : records) {
    v1::ClusterStepRecord record;
    if (!record.ParseFromString(value)) {
      // One bad key must not hide every other step from a recovering controller.
      spdlog::warn("rollpackd: etcd key {} does not hold a step record; not listed", key);
      continue;
    }
    if (!record.aborted_by().empty() || local.contains(record.step_id())) continue;
    if (!pool.empty() && record.pool() != pool) continue;
    absl::StatusOr<std::shared_ptr<CachedStep>> cached = Find(record.step_id());
    if (absl::IsNotFound(cached.status())) continue;  // released meanwhile
    if (!cached.ok()) return cached.status();
    live.push_back({(*cached)->step, record.created_unix_nanos(), Holders((*cached)->record)});
  }
  std::sort(live.begin(), live.end(), [](const LiveStep& a, const LiveStep& b) {
    return a.step->step_id < b.step->step_id;
  });
  return live;
}

int64_t ClusterSteps::CreatedUnixNanos(const std::string& step_id) {
  if (const int64_t local = store_->StepCreatedUnixNanos(step_id); local > 0) return local;
  absl::StatusOr<Cluster*> cluster = Joined();
  if (!cluster.ok()) return 0;
  absl::StatusOr<v1::ClusterStepRecord> record = ReadRecord(*cluster, step_id);
  return record.ok() ? record->created_unix_nanos() : 0;
}

absl::StatusOr<RankStep> ClusterSteps::GetStepForRank(const std::string& step_id,
                                                      const RankCoords& coords) {
  if (absl::StatusOr<std::shared_ptr<const Step>> local = store_->GetStep(step_id); local.ok()) {
    RETURN_IF_ERROR((*local)->layout.ValidateCoords(coords));
    return RankStep{*std::move(local), nullptr, nullptr};
  }
  ASSIGN_OR_RETURN(std::shared_ptr<CachedStep> cached, Find(step_id));
  const Step& step = *cached->step;
  RETURN_IF_ERROR(step.layout.ValidateCoords(coords));
  ASSIGN_OR_RETURN(std::vector<int> sequences, RankSequences(step, coords));

  std::vector<std::vector<int>> missing(cached->record.members_size());
  {
    absl::MutexLock lock(&cached->mu);
    for (int seq : sequences) {
      if (cached->samples[seq] == nullptr) missing[cached->record.owner(seq)].push_back(seq);
    }
  }
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  // An owner that left the member list (killed; its lease ran out) is
  // named at once rather than after a pull that waits on a silent host.
  bool remote = false;
  for (size_t owner = 0; owner < missing.size(); ++owner) {
    remote = remote || (!missing[owner].empty() &&
                        cached->record.members(owner) != cluster->self().id);
  }
  if (remote) {
    if (absl::StatusOr<std::vector<ClusterMember>> live = cluster->Members(); live.ok()) {
      for (size_t owner = 0; owner < missing.size(); ++owner) {
        const std::string& id = cached->record.members(owner);
        if (missing[owner].empty() ||
            std::any_of(live->begin(), live->end(),
                        [&](const ClusterMember& m) { return m.id == id; })) {
          continue;
        }
        return absl::UnavailableError(absl::StrCat(
            "step \"", step_id, "\": cluster member ", id, " holds ", missing[owner].size(),
            " of this rank's samples and is not in the cluster (down?); retry when it is back"));
      }
    }
  }
  std::vector<std::vector<std::shared_ptr<const StoredSample>>> pulled(missing.size());
  std::vector<std::vector<std::shared_ptr<const std::string>>> routing(missing.size());
  std::vector<absl::Status> results(missing.size());
  ForEachParallel(missing.size(), [&](size_t owner) {
    if (!missing[owner].empty()) {
      results[owner] = Pull(cluster, *cached, static_cast<int>(owner), missing[owner],
                            &pulled[owner], &routing[owner]);
    }
  });
  for (const absl::Status& s : results) {
    if (!s.ok()) return Prefixed(step_id, s);
  }
  auto samples = std::make_shared<std::vector<std::shared_ptr<const StoredSample>>>(
      step.sample_ids.size());
  std::shared_ptr<std::vector<std::shared_ptr<const std::string>>> rank_routing;
  if (cached->recompute()) {
    rank_routing =
        std::make_shared<std::vector<std::shared_ptr<const std::string>>>(step.sample_ids.size());
  }
  absl::MutexLock lock(&cached->mu);
  for (size_t owner = 0; owner < missing.size(); ++owner) {
    for (size_t k = 0; k < missing[owner].size(); ++k) {
      cached->samples[missing[owner][k]] = std::move(pulled[owner][k]);
      if (rank_routing != nullptr) cached->routing[missing[owner][k]] = routing[owner][k];
    }
  }
  for (int seq : sequences) {
    (*samples)[seq] = cached->samples[seq];
    if (rank_routing != nullptr) (*rank_routing)[seq] = cached->routing[seq];
  }
  return RankStep{cached->step, std::move(samples), std::move(rank_routing)};
}

absl::StatusOr<RankPieces> ClusterSteps::GetPiecesForRank(const std::string& step_id,
                                                        const RankCoords& coords) {
  if (absl::StatusOr<std::shared_ptr<const Step>> local = store_->GetStep(step_id); local.ok()) {
    RETURN_IF_ERROR((*local)->layout.ValidateCoords(coords));
    return RankPieces{RankStep{*std::move(local), nullptr, nullptr}, nullptr, {}, -1};
  }
  ASSIGN_OR_RETURN(std::shared_ptr<CachedStep> cached, Find(step_id));
  const Step& step = *cached->step;
  RETURN_IF_ERROR(step.layout.ValidateCoords(coords));
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  RankPieces pieces;
  pieces.owner = cached->owner;
  pieces.members.assign(cached->record.members().begin(), cached->record.members().end());
  for (size_t i = 0; i < pieces.members.size(); ++i) {
    if (pieces.members[i] == cluster->self().id) pieces.self = static_cast<int>(i);
  }
  auto samples = std::make_shared<std::vector<std::shared_ptr<const StoredSample>>>(
      step.sample_ids.size());
  std::shared_ptr<std::vector<std::shared_ptr<const std::string>>> rank_routing;
  if (cached->recompute()) {
    rank_routing =
        std::make_shared<std::vector<std::shared_ptr<const std::string>>>(step.sample_ids.size());
  }
  pieces.rank = RankStep{cached->step, samples, rank_routing};
  if (pieces.self < 0) return pieces;
  ASSIGN_OR_RETURN(std::vector<int> sequences, RankSequences(step, coords));
  std::vector<int> own;
  std::vector<int> missing;
  std::vector<std::string> missing_ids;
  {
    absl::MutexLock lock(&cached->mu);
    for (int seq : sequences) {
      if (cached->record.owner(seq) != pieces.self) continue;
      own.push_back(seq);
      if (cached->samples[seq] == nullptr) {
        missing.push_back(seq);
        missing_ids.push_back(step.sample_ids[seq]);
      }
    }
  }
  std::vector<std::shared_ptr<const StoredSample>> held;
  std::vector<std::shared_ptr<const std::string>> held_routing;
  if (!missing.empty()) {
    absl::StatusOr<std::vector<std::shared_ptr<const StoredSample>>> found =
        store_->HeldSamples(step_id, missing_ids);
    if (!found.ok()) {
      const absl::Status why = MissingHere(cached->record, missing_ids, found.status());
      return absl::IsDataLoss(why) ? why : Prefixed(step_id, why);
    }
    held = *std::move(found);
    if (rank_routing != nullptr) {
      absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> routing =
          store_->HeldRecomputeRouting(step_id, missing_ids);
      if (!routing.ok()) return Prefixed(step_id, routing.status());
      held_routing = *std::move(routing);
    }
  }
  absl::MutexLock lock(&cached->mu);
  // By sequence: another rank's lookup may have filled some meanwhile (with
  // the same sample: the store holds one per id).
  for (size_t k = 0; k < missing.size(); ++k) {
    if (cached->samples[missing[k]] == nullptr) {
      cached->samples[missing[k]] = std::move(held[k]);
      if (rank_routing != nullptr) cached->routing[missing[k]] = std::move(held_routing[k]);
    }
  }
  for (int seq : own) {
    (*samples)[seq] = cached->samples[seq];
    if (rank_routing != nullptr) (*rank_routing)[seq] = cached->routing[seq];
  }
  return pieces;
}

absl::Status ClusterSteps::Pull(Cluster* cluster, const CachedStep& cached, int owner,
                                const std::vector<int>& sequences,
                                std::vector<std::shared_ptr<const StoredSample>>* out,
                                std::vector<std::shared_ptr<const std::string>>* routing) {
  const v1::ClusterStepRecord& record = cached.record;
  std::vector<std::string> ids;
  ids.reserve(sequences.size());
  for (int seq : sequences) ids.push_back(record.sample_ids(seq));
  const std::string& member = record.members(owner);
  if (member == cluster->self().id) {
    absl::StatusOr<std::vector<std::shared_ptr<const StoredSample>>> held =
        store_->HeldSamples(record.step_id(), ids);
    if (!held.ok()) return MissingHere(record, ids, held.status());
    *out = *std::move(held);
    if (cached.recompute()) {
      ASSIGN_OR_RETURN(*routing, store_->HeldRecomputeRouting(record.step_id(), ids));
    }
    return CheckLengths(record, sequences, *out);
  }
  v1::ReadSamplesRequest request;
  request.set_step_id(record.step_id());
  for (const std::string& id : ids) request.add_sample_ids(id);
  grpc::ClientContext context;
  SetDeadline(&context, options_.pull_timeout);
  auto reader = cluster->MemberStub({member, member})->ReadSamples(&context, request);
  StallWatch watch(options_.pull_stall_timeout, [&context] { context.TryCancel(); });
  v1::SampleBatch batch;
  out->clear();
  out->reserve(ids.size());
  routing->clear();
  int64_t bytes = 0;
  absl::Status decoded;
  while (reader->Read(&batch)) {
    watch.Progress();
    std::string pool;
    std::vector<StoredSample> samples;
    const RecordType type = batch.record_type() == 0
                                ? RecordType::kPutSamples
                                : static_cast<RecordType>(batch.record_type());
    if (type != RecordType::kPutSamples && type != RecordType::kRaggedSamples) {
      decoded = absl::DataLossError(absl::StrCat("member ", member, " sent samples of record type ",
                                                 batch.record_type(), " (every member must run "
                                                 "the same version: docs/cluster.md)"));
      break;
    }
    decoded = DecodeSamples(batch.encoded(), &pool, &samples, type);
    if (!decoded.ok()) break;
    if (cached.recompute() &&
        batch.recompute_routing_size() != static_cast<int>(samples.size())) {
      decoded = absl::DataLossError(absl::StrCat(
          "member ", member, " sent ", samples.size(), " samples of a RECOMPUTE step with ",
          batch.recompute_routing_size(), " recompute routings (every member must run the same "
          "version: docs/cluster.md)"));
      break;
    }
    bytes += static_cast<int64_t>(batch.ByteSizeLong());
    for (StoredSample& s : samples) {
      out->push_back(std::make_shared<const StoredSample>(std::move(s)));
    }
    if (cached.recompute()) {
      for (std::string& r : *batch.mutable_recompute_routing()) {
        routing->push_back(std::make_shared<const std::string>(std::move(r)));
      }
    }
  }
  if (!decoded.ok()) context.TryCancel();
  grpc::Status finished = reader->Finish();
  if (watch.stalled()) {
    return absl::UnavailableError(absl::StrCat(
        "cluster member ", member, " does not answer (ReadSamples): nothing sent for ",
        absl::FormatDuration(options_.pull_stall_timeout)));
  }
  RETURN_IF_ERROR(FromPeer(finished, member, "ReadSamples"));
  RETURN_IF_ERROR(decoded);
  pulled_bytes_.fetch_add(bytes);
  if (out->size() != ids.size()) {
    return absl::DataLossError(absl::StrCat("member ", member, " sent ", out->size(),
                                            " samples, ", ids.size(), " were asked"));
  }
  const ModelSpec& model = cached.step->model;
  for (size_t i = 0; i < ids.size(); ++i) {
    if ((*out)[i]->sample_id != ids[i]) {
      return absl::DataLossError(absl::StrCat("member ", member, " sent sample \"",
                                              (*out)[i]->sample_id, "\" for \"", ids[i], "\""));
    }
    // The encoder reads [n, stored layers, K] ids of the store's width.
    if (cached.recompute() &&
        static_cast<int64_t>((*routing)[i]->size()) !=
            (*out)[i]->num_tokens() * model.stored_layers() * model.topk *
                model.stored_id_bytes()) {
      return absl::DataLossError(absl::StrCat("member ", member, " sent ", (*routing)[i]->size(),
                                              " bytes of recompute routing for sample \"",
                                              ids[i], "\""));
    }
  }
  return CheckLengths(record, sequences, *out);
}

absl::Status ClusterSteps::CheckLengths(
    const v1::ClusterStepRecord& record, const std::vector<int>& sequences,
    const std::vector<std::shared_ptr<const StoredSample>>& samples) {
  // The record comes from etcd, which anyone with its address may write: a
  // length that is not the sample's would gather other memory (or crash).
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t recorded = record.num_tokens(sequences[i]);
    if (samples[i]->num_tokens() != recorded) {
      return absl::DataLossError(absl::StrCat(
          "step \"", record.step_id(), "\": sample \"", samples[i]->sample_id, "\" holds ",
          samples[i]->num_tokens(), " tokens, the step's record says ", recorded));
    }
  }
  return absl::OkStatus();
}

}  // namespace rollpack
