// The Member RPC handlers (server/cluster/member_service.h) with any request
// messages, as another member (or, where the cluster runs on a trusted
// network, anyone who reaches the port) can send them. Each input gets a
// fresh member: a SampleStore with two pools (MoE and dense) and stored
// samples, a live step of its own ("L1"), a confirmed hold of a cluster
// step ("c1", two of its samples here and two on another member), free
// samples with recompute routing (R2) and an incomplete group; the
// ClusterSteps and MemberService are built as server.cc builds them. The
// handlers run behind an in-process gRPC server (so reactors, streams and
// the off-thread routing calls run as they do in rollpackd).
//
// Input: calls, each [selector byte][length, 2 bytes little endian][that
// many bytes of the request message]. selector % 13 picks the method (0-9
// in member.proto's order; 10-12 below); bit 0x80 sends it to a member
// running with mutual TLS (Authorizer with a member identity) without a
// member certificate but with an admin token.
//
// Without etcd this member is not joined, so StageRouting, CheckRouting and
// CommitRouting answer UNAVAILABLE before they read the request. Selectors
// 10-12 take the same messages to what those handlers reach on a joined
// member once ClusterSteps::HeldShare found the step's record in etcd:
// ViewRecordedRouting and RecomputeUploads::UploadHeld / CheckHeld /
// CommitHeld, with the HeldStep planned by StepFromRecord from the records
// a planner would have written for the holds (c1, and every hold a
// HoldSamples call here took).
//
// Oracle: every call returns (deadline 10 s), with a code the handler may
// give (docs/wire.md; never UNKNOWN, INTERNAL, DATA_LOSS...); no sanitizer
// report; the store's counts stay sane (free <= stored, bytes within the
// limit); a call refused by authorization changes nothing; a call that names
// no step, or another step, never touches the samples of the live step or
// of the confirmed hold; ReadSamples sends exactly the samples asked for, as
// stored; a HoldSamples that succeeds holds every sample it named.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "fuzz/fuzz_common.h"
#include "google/protobuf/stubs/logging.h"
#include "rollpack/v1/member.grpc.pb.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/member_service.h"
#include "server/cluster/step_record.h"
#include "server/ops/auth.h"
#include "server/store/convert.h"
#include "server/store/log_records.h"
#include "server/store/recompute_uploads.h"
#include "server/store/sample_store.h"

using namespace rollpack;

namespace {

constexpr int64_t kMaxMemoryBytes = 64 << 20;
constexpr int kMaxCalls = 48;
constexpr int64_t kHoldAttempt = 1700000000000000001;
constexpr char kSelf[] = "127.0.0.1:50051";
constexpr char kOther[] = "127.0.0.1:50052";
constexpr char kAdminToken[] = "fuzz-admin-token-0123456789";

bool Verbose() {
  static const bool verbose = std::getenv("ROLLPACK_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

// Forwards every Member method to the MemberService of the current input,
// so that one in-process server serves a fresh member per input.
class Forward final : public v1::Member::CallbackService {
 public:
  std::atomic<MemberService*> target{nullptr};

  grpc::ServerUnaryReactor* ListFreeSamples(grpc::CallbackServerContext* c,
                                            const v1::ListFreeSamplesRequest* q,
                                            v1::FreeSamples* r) override {
    return target.load()->ListFreeSamples(c, q, r);
  }
  grpc::ServerUnaryReactor* HoldSamples(grpc::CallbackServerContext* c,
                                        const v1::HoldSamplesRequest* q,
                                        v1::HoldSamplesResponse* r) override {
    return target.load()->HoldSamples(c, q, r);
  }
  grpc::ServerUnaryReactor* ConfirmHold(grpc::CallbackServerContext* c,
                                        const v1::StepHoldRequest* q,
                                        v1::ConfirmHoldResponse* r) override {
    return target.load()->ConfirmHold(c, q, r);
  }
  grpc::ServerUnaryReactor* DropHold(grpc::CallbackServerContext* c, const v1::StepHoldRequest* q,
                                     v1::DropHoldResponse* r) override {
    return target.load()->DropHold(c, q, r);
  }
  grpc::ServerUnaryReactor* ReleaseHold(grpc::CallbackServerContext* c,
                                        const v1::StepHoldRequest* q,
                                        v1::DropHoldResponse* r) override {
    return target.load()->ReleaseHold(c, q, r);
  }
  grpc::ServerUnaryReactor* DropGroups(grpc::CallbackServerContext* c,
                                       const v1::DropGroupsRequest* q,
                                       v1::DropGroupsResponse* r) override {
    return target.load()->DropGroups(c, q, r);
  }
  grpc::ServerWriteReactor<v1::SampleBatch>* ReadSamples(
      grpc::CallbackServerContext* c, const v1::ReadSamplesRequest* q) override {
    return target.load()->ReadSamples(c, q);
  }
  grpc::ServerUnaryReactor* StageRouting(grpc::CallbackServerContext* c,
                                         const v1::StageRoutingRequest* q,
                                         v1::UploadRoutingResponse* r) override {
    return target.load()->StageRouting(c, q, r);
  }
  grpc::ServerUnaryReactor* CheckRouting(grpc::CallbackServerContext* c,
                                         const v1::MemberRoutingRequest* q,
                                         v1::CommitRoutingResponse* r) override {
    return target.load()->CheckRouting(c, q, r);
  }
  grpc::ServerUnaryReactor* CommitRouting(grpc::CallbackServerContext* c,
                                          const v1::MemberRoutingRequest* q,
                                          v1::CommitRoutingResponse* r) override {
    return target.load()->CommitRouting(c, q, r);
  }
};

struct Harness {
  Forward forward;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Member::Stub> stub;
  // server.cc's Authorizer in a cluster with mutual TLS: a member identity
  // (and here one admin token, which must not open the Member service).
  Authorizer mtls;
};

Harness& TheHarness() {
  static Harness* h = [] {
    auto* h = new Harness();
    grpc::ServerBuilder builder;
    builder.RegisterService(&h->forward);
    h->server = builder.BuildAndStart();
    FUZZ_CHECK(h->server != nullptr);
    h->stub = v1::Member::NewStub(h->server->InProcessChannel(grpc::ChannelArguments()));
    absl::StatusOr<Authorizer> auth = Authorizer::Parse(std::string("admin ") + kAdminToken + "\n");
    FUZZ_CHECK(auth.ok());
    h->mtls = *std::move(auth);
    h->mtls.set_member_identity("rollpack-member");
    return h;
  }();
  return *h;
}

ModelSpec MoeModel() {
  ModelSpec m;
  m.name = "m";
  m.num_layers = 4;
  m.num_experts = 8;
  m.topk = 2;
  return m;
}

ModelSpec DenseModel() {
  ModelSpec m;
  m.name = "d";
  m.num_layers = 2;
  return m;
}

Topology Topo() {
  Topology t;
  t.dp = 1;
  t.max_tokens_per_rank = 1024;
  return t;
}

StoredSample Sample(const ModelSpec& model, const std::string& id, int64_t n,
                    const std::string& group, int32_t group_size) {
  StoredSample s;
  s.sample_id = id;
  s.group_id = group;
  s.group_size = group_size;
  s.policy_version = 1;
  s.tokens.assign(n, 7);
  s.experts.assign(n * model.stored_layers() * model.topk * model.stored_id_bytes(), '\x01');
  if (model.num_experts == 0) s.experts.clear();
  s.row_valid.assign(n, 1);
  StoredField f;
  f.dtype = v1::FLOAT32;
  f.data.assign(n * 4, '\0');
  s.token_fields["logprobs"] = f;
  return s;
}

// A planner's record of a step whose samples `ours` this member holds (and
// `theirs`, lengths only, another member does).
v1::ClusterStepRecord RecordOf(const std::string& step_id, const std::string& pool,
                               const ModelSpec& model, int64_t attempt,
                               const std::vector<std::pair<std::string, int64_t>>& ours,
                               const std::vector<std::pair<std::string, int64_t>>& theirs,
                               bool recompute) {
  v1::ClusterStepRecord r;
  r.set_step_id(step_id);
  r.set_pool(pool);
  *r.mutable_topology() = ToProto(Topo());
  *r.mutable_model() = ToProto(model);
  r.add_members(kSelf);
  r.add_members(kOther);
  for (const auto& [id, n] : ours) {
    r.add_sample_ids(id);
    r.add_num_tokens(n);
    r.add_owner(0);
  }
  for (const auto& [id, n] : theirs) {
    r.add_sample_ids(id);
    r.add_num_tokens(n);
    r.add_owner(1);
  }
  r.set_coordinator(kOther);
  r.set_created_unix_nanos(attempt);
  if (recompute) r.set_replay_source(v1::REPLAY_SOURCE_RECOMPUTE);
  return r;
}

// One input's member.
struct Member {
  SampleStore store{kMaxMemoryBytes};
  ClusterSteps steps{&store};
  MemberService open{&store, &steps, nullptr};
  // Made at the first call through it: each MemberService starts 4 threads,
  // and the sanitizers keep ~200 bytes for every thread ever started.
  std::unique_ptr<MemberService> mtls;
  const Authorizer* const auth;
  // The owner's R2 stages reached by selectors 10-12 (ClusterSteps keeps
  // its own, which only a joined member's handlers reach).
  RecomputeUploads uploads{&store};
  // What etcd would hold: the records of the steps this member holds
  // samples of.
  struct Known {
    v1::ClusterStepRecord record;
    std::shared_ptr<const Step> step;
    std::shared_ptr<const std::vector<int32_t>> owner;
  };
  std::map<std::string, Known> records;
  // Samples no call naming another step may touch, while their step lives.
  std::shared_ptr<const Step> live_step;
  bool hold_live = true;

  explicit Member(const Authorizer* mtls_auth) : auth(mtls_auth) {}

  MemberService* Mtls() {
    if (mtls == nullptr) mtls = std::make_unique<MemberService>(&store, &steps, auth);
    return mtls.get();
  }

  void Remember(const v1::ClusterStepRecord& record) {
    absl::StatusOr<std::shared_ptr<const Step>> step = StepFromRecord(record.step_id(), record);
    if (!step.ok()) return;
    Known k;
    k.record = record;
    k.step = *std::move(step);
    k.owner = std::make_shared<const std::vector<int32_t>>(record.owner().begin(),
                                                           record.owner().end());
    records[record.step_id()] = std::move(k);
  }

  // ClusterSteps::HeldShare with `records` for etcd.
  absl::StatusOr<HeldStep> Share(const std::string& step_id, int64_t attempt) {
    auto it = records.find(step_id);
    if (it == records.end()) {
      return absl::NotFoundError(absl::StrCat("step \"", step_id, "\" not found"));
    }
    if (it->second.record.created_unix_nanos() != attempt) {
      return absl::FailedPreconditionError("another attempt");
    }
    HeldStep held;
    held.step = it->second.step;
    held.owner = it->second.owner;
    held.attempt = attempt;
    held.self = 0;
    return held;
  }
};

void Setup(Member* m) {
  SampleStore& store = m->store;
  const ModelSpec moe = MoeModel();
  FUZZ_CHECK(store.RegisterModel("p", moe).ok());
  FUZZ_CHECK(store.RegisterModel("d", DenseModel()).ok());
  std::vector<StoredSample> batch;
  batch.push_back(Sample(moe, "s0", 5, "g0", 2));
  batch.push_back(Sample(moe, "s1", 9, "g0", 2));
  batch.push_back(Sample(moe, "s2", 3, "g1", 2));
  batch.push_back(Sample(moe, "s3", 12, "g1", 2));
  batch.push_back(Sample(moe, "s4", 7, "g2", 2));
  batch.push_back(Sample(moe, "s5", 4, "g2", 2));
  batch.push_back(Sample(moe, "s6", 6, "g3", 3));
  batch.push_back(Sample(moe, "s7", 10, "g3", 3));
  FUZZ_CHECK(store.Put("p", std::move(batch)).ok());
  std::vector<StoredSample> dense;
  dense.push_back(Sample(DenseModel(), "d0", 8, "", 0));
  dense.push_back(Sample(DenseModel(), "d1", 5, "", 0));
  FUZZ_CHECK(store.Put("d", std::move(dense)).ok());

  // R2: s2 and s3 get recompute routing from a reuse step, which returns
  // them to the free set (a RECOMPUTE hold can take them).
  StepRequest r0;
  r0.step_id = "R0";
  r0.pool = "p";
  r0.sample_ids = {"s2", "s3"};
  r0.topology = Topo();
  r0.reuse_samples = true;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(r0);
  FUZZ_CHECK(step.ok());
  std::vector<std::string> routing;
  for (int64_t n : {3, 12}) routing.push_back(std::string(n * 4 * 2, '\x02'));
  FUZZ_CHECK(store.SetRecomputeRouting(*step, std::move(routing)).ok());
  FUZZ_CHECK(store.ReleaseStep("R0").ok());

  // A step of this member's own, live.
  step = store.CreateStep("L1", "p", {"s0", "s1"}, 0, Topo());
  FUZZ_CHECK(step.ok());
  m->live_step = *step;

  // This member's share of cluster step c1 (s4, s5; o1, o2 on the other
  // member), committed: the hold is confirmed and etcd has its record.
  FUZZ_CHECK(store.Hold("c1", "p", {"s4", "s5"}, kOther, kHoldAttempt).ok());
  FUZZ_CHECK(store.ConfirmHold("c1").ok());
  m->Remember(RecordOf("c1", "p", moe, kHoldAttempt, {{"s4", 7}, {"s5", 4}},
                       {{"o1", 5}, {"o2", 6}}, false));
  FUZZ_CHECK(m->records.count("c1") == 1);
}

// The protected samples are where they were.
void CheckProtected(Member* m, const std::set<std::string>& named) {
  SampleStore& store = m->store;
  if (m->live_step != nullptr) {
    if (named.count("L1")) {
      absl::StatusOr<std::shared_ptr<const Step>> now = store.GetStep("L1");
      if (!now.ok() || *now != m->live_step) m->live_step = nullptr;  // released by name
    } else {
      absl::StatusOr<std::shared_ptr<const Step>> now = store.GetStep("L1");
      FUZZ_CHECK(now.ok() && *now == m->live_step);
      absl::StatusOr<SampleStore::SampleListing> listing =
          store.ListSamples("p", {"s0", "s1"}, 0);
      FUZZ_CHECK(listing.ok() && listing->sample_ids.size() == 2);
      FUZZ_CHECK(!listing->free[0] && !listing->free[1]);
    }
  }
  if (m->hold_live) {
    if (named.count("c1")) {
      m->hold_live = store.HoldAttempt("c1") == kHoldAttempt &&
                     store.HeldSamples("c1", {"s4", "s5"}).ok();
    } else {
      FUZZ_CHECK(store.HoldAttempt("c1") == kHoldAttempt);
      FUZZ_CHECK(store.HeldSamples("c1", {"s4", "s5"}).ok());
    }
  }
}

struct Snapshot {
  StoreStats stats;
  std::vector<std::string> holds;
  std::vector<std::pair<int64_t, int64_t>> pools;  // samples, free
  bool operator==(const Snapshot& o) const {
    return stats.stored_bytes == o.stats.stored_bytes && stats.num_samples == o.stats.num_samples &&
           stats.num_live_steps == o.stats.num_live_steps && holds == o.holds && pools == o.pools;
  }
};

Snapshot Snap(const SampleStore& store) {
  Snapshot s;
  s.stats = store.Stats();
  s.holds = store.HoldIds();
  std::sort(s.holds.begin(), s.holds.end());
  for (const std::string& name : store.PoolNames()) {
    absl::StatusOr<PoolStats> pool = store.GetPool(name);
    FUZZ_CHECK(pool.ok());
    s.pools.emplace_back(pool->num_samples, pool->num_free_samples);
  }
  return s;
}

void CheckSane(const Snapshot& s) {
  FUZZ_CHECK(s.stats.num_samples >= 0);
  FUZZ_CHECK(s.stats.stored_bytes >= 0 && s.stats.stored_bytes <= kMaxMemoryBytes);
  FUZZ_CHECK(s.stats.num_live_steps >= 0);
  int64_t total = 0;
  for (const auto& [samples, free] : s.pools) {
    FUZZ_CHECK(free >= 0 && free <= samples);
    total += samples;
  }
  FUZZ_CHECK(total == s.stats.num_samples);
}

// What a handler may answer (docs/wire.md); UNAVAILABLE only from the
// routing methods of a member that is not joined.
void CheckCode(grpc::StatusCode code, bool routing) {
  switch (code) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::OUT_OF_RANGE:  // a micro-batch index outside the step's
      return;
    case grpc::StatusCode::UNAVAILABLE:
      FUZZ_CHECK(routing);
      return;
    default:
      std::fprintf(stderr, "unexpected status code %d\n", static_cast<int>(code));
      FUZZ_CHECK(false && "unexpected status code");
  }
}

void CheckCode(absl::StatusCode code) {
  CheckCode(static_cast<grpc::StatusCode>(code), /*routing=*/false);
}

std::unique_ptr<grpc::ClientContext> Context(bool authed) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (authed) context->AddMetadata("authorization", std::string("Bearer ") + kAdminToken);
  return context;
}

// ReadSamples: every batch decodes, and the samples are those asked for,
// in order, as stored.
grpc::Status ReadAll(Member* m, v1::Member::Stub* stub, bool authed,
                     const v1::ReadSamplesRequest& request) {
  // What the store holds for the step before the call (the reply's truth).
  absl::StatusOr<std::vector<std::shared_ptr<const StoredSample>>> held = m->store.HeldSamples(
      request.step_id(), std::vector<std::string>(request.sample_ids().begin(),
                                                  request.sample_ids().end()));
  absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> held_routing =
      m->store.HeldRecomputeRouting(request.step_id(),
                                    std::vector<std::string>(request.sample_ids().begin(),
                                                             request.sample_ids().end()));
  std::unique_ptr<grpc::ClientContext> context = Context(authed);
  std::unique_ptr<grpc::ClientReader<v1::SampleBatch>> reader =
      stub->ReadSamples(context.get(), request);
  v1::SampleBatch batch;
  std::vector<StoredSample> got;
  std::vector<std::string> routing;
  while (reader->Read(&batch)) {
    std::string pool;
    std::vector<StoredSample> samples;
    // Batches with ragged fields say so (SampleBatch.record_type).
    const RecordType type = batch.record_type() == 0
                                ? RecordType::kPutSamples
                                : static_cast<RecordType>(batch.record_type());
    FUZZ_CHECK(DecodeSamples(batch.encoded(), &pool, &samples, type).ok());
    FUZZ_CHECK(batch.recompute_routing_size() == 0 ||
               batch.recompute_routing_size() == static_cast<int>(samples.size()));
    for (const std::string& r : batch.recompute_routing()) routing.push_back(r);
    for (StoredSample& s : samples) got.push_back(std::move(s));
  }
  grpc::Status status = reader->Finish();
  if (status.ok()) {
    FUZZ_CHECK(!authed);
    FUZZ_CHECK(held.ok());
    FUZZ_CHECK(got.size() == static_cast<size_t>(request.sample_ids_size()));
    // A RECOMPUTE hold sends the routing it took with every sample; any
    // other, none.
    FUZZ_CHECK(routing.size() == (held_routing.ok() ? got.size() : 0));
    for (size_t i = 0; i < got.size(); ++i) {
      FUZZ_CHECK(got[i].sample_id == request.sample_ids(static_cast<int>(i)));
      FUZZ_CHECK(got[i].tokens == (*held)[i]->tokens);
      FUZZ_CHECK(got[i].experts == (*held)[i]->experts);
      FUZZ_CHECK(got[i].ragged_fields == (*held)[i]->ragged_fields);
      if (!routing.empty()) FUZZ_CHECK(routing[i] == *(*held_routing)[i]);
    }
  }
  return status;
}

// One call; returns the step ids it named.
void Call(Member* m, uint8_t selector, const uint8_t* data, size_t size) {
  Harness& h = TheHarness();
  const bool authed = (selector & 0x80) != 0;
  const int method = (selector & 0x7f) % 13;
  if (method < 10) h.forward.target.store(authed ? m->Mtls() : &m->open);
  v1::Member::Stub* stub = h.stub.get();
  // The stages of holds gone (ClusterSteps drops its own every tick).
  m->uploads.DropStale();
  const Snapshot before = Snap(m->store);
  std::set<std::string> named;
  grpc::Status status;
  bool direct = false;  // selectors 10-12: no gRPC, no authorization
  absl::Status direct_status;
  const int n = static_cast<int>(size);
  switch (method) {
    case 0: {
      v1::ListFreeSamplesRequest q;
      if (!q.ParseFromArray(data, n)) return;
      v1::FreeSamples r;
      status = stub->ListFreeSamples(Context(authed).get(), q, &r);
      if (status.ok()) {
        const int k = r.sample_ids_size();
        FUZZ_CHECK(r.num_tokens_size() == k && r.arrival_unix_nanos_size() == k &&
                   r.free_size() == k && r.group_ids_size() == k && r.group_sizes_size() == k &&
                   r.policy_versions_size() == k);
        if (q.sample_ids_size() == 0 && !q.all_with_metadata() && q.limit() >= 0) {
          FUZZ_CHECK(k <= q.limit());
        }
      }
      break;
    }
    case 1: {
      v1::HoldSamplesRequest q;
      if (!q.ParseFromArray(data, n)) return;
      named.insert(q.step_id());
      v1::HoldSamplesResponse r;
      status = stub->HoldSamples(Context(authed).get(), q, &r);
      if (status.ok()) {
        const std::vector<std::string> ids(q.sample_ids().begin(), q.sample_ids().end());
        absl::StatusOr<std::vector<std::shared_ptr<const StoredSample>>> held =
            m->store.HeldSamples(q.step_id(), ids);
        FUZZ_CHECK(held.ok());
        FUZZ_CHECK(m->store.HoldAttempt(q.step_id()) == q.attempt());
        // The planner commits it: its record, as etcd would have it.
        std::vector<std::pair<std::string, int64_t>> ours;
        for (const auto& s : *held) ours.emplace_back(s->sample_id, s->num_tokens());
        absl::StatusOr<ModelSpec> model = m->store.GetModel(q.pool());
        FUZZ_CHECK(model.ok());
        m->Remember(RecordOf(q.step_id(), q.pool(), *model, q.attempt(), ours, {{"o9", 3}},
                             q.replay_source() == v1::REPLAY_SOURCE_RECOMPUTE));
      }
      break;
    }
    case 2:
    case 3:
    case 4: {
      v1::StepHoldRequest q;
      if (!q.ParseFromArray(data, n)) return;
      named.insert(q.step_id());
      if (method == 2) {
        v1::ConfirmHoldResponse r;
        status = stub->ConfirmHold(Context(authed).get(), q, &r);
      } else {
        v1::DropHoldResponse r;
        status = method == 3 ? stub->DropHold(Context(authed).get(), q, &r)
                             : stub->ReleaseHold(Context(authed).get(), q, &r);
        if (status.ok()) {
          FUZZ_CHECK(r.released_samples() >= 0 && r.returned_samples() >= 0 &&
                     r.freed_bytes() >= 0);
          FUZZ_CHECK(m->store.HoldAttempt(q.step_id()) == 0);
        }
      }
      break;
    }
    case 5: {
      v1::DropGroupsRequest q;
      if (!q.ParseFromArray(data, n)) return;
      v1::DropGroupsResponse r;
      status = stub->DropGroups(Context(authed).get(), q, &r);
      if (status.ok()) FUZZ_CHECK(r.dropped_samples() >= 0);
      break;
    }
    case 6: {
      v1::ReadSamplesRequest q;
      if (!q.ParseFromArray(data, n)) return;
      named.insert(q.step_id());
      status = ReadAll(m, stub, authed, q);
      break;
    }
    case 7: {
      v1::StageRoutingRequest q;
      if (!q.ParseFromArray(data, n)) return;
      named.insert(q.routing().step_id());
      v1::UploadRoutingResponse r;
      status = stub->StageRouting(Context(authed).get(), q, &r);
      break;
    }
    case 8:
    case 9: {
      v1::MemberRoutingRequest q;
      if (!q.ParseFromArray(data, n)) return;
      named.insert(q.step_id());
      v1::CommitRoutingResponse r;
      status = method == 8 ? stub->CheckRouting(Context(authed).get(), q, &r)
                           : stub->CommitRouting(Context(authed).get(), q, &r);
      break;
    }
    case 10: {
      // ClusterSteps::StageHeldRouting past HeldShare.
      v1::StageRoutingRequest q;
      if (!q.ParseFromArray(data, n)) return;
      direct = true;
      const v1::RecordedRouting& routing = q.routing();
      named.insert(routing.step_id());
      direct_status = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(HeldStep held, m->Share(routing.step_id(), q.attempt()));
        ASSIGN_OR_RETURN(UploadedRouting share, ViewRecordedRouting(routing));
        share.rows = q.uploaded_rows();
        const RankCoords coords{routing.rank().dp(), routing.rank().cp(), routing.rank().tp(),
                                routing.rank().pp()};
        ASSIGN_OR_RETURN(RoutingUploadResult result,
                         m->uploads.UploadHeld(held, coords, routing.index(), share));
        FUZZ_CHECK(result.rows >= 0 && result.repeated_rows >= 0 && result.missing_entries >= 0);
        FUZZ_CHECK(result.repeated_rows <= result.rows);
        return absl::OkStatus();
      }();
      break;
    }
    case 11:
    case 12: {
      // ClusterSteps::CheckHeldRouting / CommitHeldRouting past HeldShare.
      v1::MemberRoutingRequest q;
      if (!q.ParseFromArray(data, n)) return;
      direct = true;
      named.insert(q.step_id());
      direct_status = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(HeldStep held, m->Share(q.step_id(), q.attempt()));
        ASSIGN_OR_RETURN(RoutingCommitResult result,
                         method == 11 ? m->uploads.CheckHeld(held) : m->uploads.CommitHeld(held));
        FUZZ_CHECK(result.samples >= 0 && result.tokens >= 0 && result.stored_bytes >= 0);
        return absl::OkStatus();
      }();
      break;
    }
  }
  const Snapshot after = Snap(m->store);
  if (Verbose()) {
    std::fprintf(stderr, "call %d%s: %d %s\n", method, authed && !direct ? " (mtls)" : "",
                 direct ? static_cast<int>(direct_status.code())
                        : static_cast<int>(status.error_code()),
                 direct ? std::string(direct_status.message()).c_str()
                        : status.error_message().c_str());
  }
  if (direct) {
    CheckCode(direct_status.code());
  } else if (authed) {
    // No member certificate: refused, whatever the token, and nothing changed.
    FUZZ_CHECK(status.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    FUZZ_CHECK(before == after);
  } else {
    FUZZ_CHECK(status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED);
    CheckCode(status.error_code(), /*routing=*/method >= 7);
    // A refused call changes nothing (all or nothing); a routing call of a
    // member that is not joined changes nothing either.
    if (!status.ok() || method >= 7) FUZZ_CHECK(before == after);
  }
  CheckSane(after);
  CheckProtected(m, named);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static google::protobuf::LogSilencer* quiet = new google::protobuf::LogSilencer();
  (void)quiet;
  Harness& h = TheHarness();
  {
    Member member(&h.mtls);
    Setup(&member);
    CheckSane(Snap(member.store));
    CheckProtected(&member, {});
    size_t at = 0;
    for (int calls = 0; calls < kMaxCalls && at + 3 <= size; ++calls) {
      const uint8_t selector = data[at];
      const size_t length = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
      Call(&member, selector, data + at + 3, length);
      at += 3 + length;
    }
    h.forward.target.store(nullptr);
  }
  return 0;
}
