// The bad-input corpus: malformed requests drawn from real failures, each
// sent to a running server over gRPC. Each must get the right status code
// and a message naming the problem; the server's state must be unchanged and
// it must keep serving. With ROLLPACK_BAD_INPUT_TABLE=FILE the test writes
// the corpus as the markdown table of docs/reliability.md.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/store/sample_store.h"
#include "testing/synthetic_rollouts.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 4, kExperts = 64, kTopk = 4;

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("qwen-like");
  m.set_num_layers(kLayers);
  m.set_num_experts(kExperts);
  m.set_topk(kTopk);
  return m;
}

v1::ModelSpec WideModel() {
  v1::ModelSpec m = Model();
  m.set_name("wide");
  m.set_num_experts(300);
  return m;
}

template <typename T>
void Set(std::string* data, int64_t i, T v) {
  std::memcpy(data->data() + i * sizeof(T), &v, sizeof(T));
}

// What vLLM returns: int32 routed experts over the full layer axis, n - 1
// rows, plus per-token logprobs.
v1::Sample Good(const std::string& id, int64_t n, int experts = kExperts) {
  v1::Sample s;
  s.set_sample_id(id);
  s.set_group_id("g");
  v1::NDArray* tokens = s.mutable_tokens();
  tokens->set_dtype(v1::INT32);
  tokens->add_shape(n);
  tokens->mutable_data()->resize(n * 4);
  for (int64_t t = 0; t < n; ++t) Set<int32_t>(tokens->mutable_data(), t, 100 + t % 1000);
  v1::NDArray* re = s.mutable_routed_experts();
  re->set_dtype(v1::INT32);
  re->add_shape(n - 1);
  re->add_shape(kLayers);
  re->add_shape(kTopk);
  re->mutable_data()->resize((n - 1) * kLayers * kTopk * 4);
  for (int64_t r = 0; r < n - 1; ++r)
    for (int l = 0; l < kLayers; ++l)
      for (int k = 0; k < kTopk; ++k)
        Set<int32_t>(re->mutable_data(), (r * kLayers + l) * kTopk + k,
                     static_cast<int32_t>((r + 7 * l + 13 * k) % experts));
  v1::NDArray& lp = (*s.mutable_token_fields())["logprobs"];
  lp.set_dtype(v1::FLOAT32);
  lp.add_shape(n);
  lp.mutable_data()->resize(n * 4);
  return s;
}

int32_t* Expert(v1::Sample* s, int64_t row, int layer, int k) {
  return reinterpret_cast<int32_t*>(s->mutable_routed_experts()->mutable_data()->data()) +
         (row * kLayers + layer) * kTopk + k;
}

struct Snapshot {
  std::string text;
  bool operator==(const Snapshot& o) const { return text == o.text; }
};

class BadInputTest : public ::testing::Test {
  public:
  void SetUp() override {
    ServerOptions options;
    options.max_memory_bytes = 64 << 20;
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = MakeChannel(server_->address());
    client_ = std::make_unique<RollpackClient>(channel_);
    // A pool with stored samples and a live step, so "unchanged" means something.
    ASSERT_TRUE(client_->RegisterModel("p", Model()).ok());
    ASSERT_TRUE(client_->RegisterModel("wide", WideModel()).ok());
    std::vector<v1::Sample> samples;
    for (int i = 0; i < 12; ++i) samples.push_back(Good("s" + std::to_string(i), 64 + 8 * i));
    ASSERT_TRUE(client_->PutSamples("p", samples).ok());
    v1::CreateStepRequest create;
    create.set_step_id("live");
    create.set_pool("p");
    create.add_sample_ids("s0");
    create.add_sample_ids("s1");
    *create.mutable_topology() = Topology();
    ASSERT_TRUE(client_->CreateStep(create).ok());
  }
  void TearDown() override { server_->Shutdown(absl::Seconds(1)); }

  static v1::Topology Topology() {
    v1::Topology t;
    t.set_dp(2);
    t.set_max_tokens_per_rank(512);
    return t;
  }

  Snapshot Take() {
    Snapshot s;
    for (const char* pool : {"p", "wide"}) {
      absl::StatusOr<v1::PoolInfo> info = client_->GetPool(pool);
      s.text += info.ok() ? info->ShortDebugString() : info.status().ToString();
      s.text += "\n";
    }
    const StoreStats stats = server_->store().Stats();
    s.text += std::to_string(stats.num_samples) + " " + std::to_string(stats.stored_bytes) + " " +
              std::to_string(stats.num_live_steps);
    absl::StatusOr<v1::Plan> plan = client_->GetPlan("live");
    s.text += plan.ok() ? plan->stats().ShortDebugString() : plan.status().ToString();
    return s;
  }

  absl::Status Put(const std::string& pool, std::vector<v1::Sample> samples) {
    return client_->PutSamples(pool, samples).status();
  }
  absl::Status Put(v1::Sample sample) { return Put("p", {std::move(sample)}); }

  absl::Status Create(const std::function<void(v1::CreateStepRequest*)>& edit) {
    v1::CreateStepRequest create;
    create.set_step_id("new-step");
    create.set_pool("p");
    create.set_num_samples(4);
    *create.mutable_topology() = Topology();
    edit(&create);
    return client_->CreateStep(create).status();
  }

  absl::Status Fetch(const std::string& step, int dp, int start) {
    auto stub = v1::Trainer::NewStub(channel_);
    grpc::ClientContext context;
    v1::FetchRequest request;
    request.set_step_id(step);
    request.mutable_rank()->set_dp(dp);
    request.set_start_index(start);
    auto reader = stub->FetchMicrobatches(&context, request);
    v1::Microbatch mb;
    while (reader->Read(&mb)) {
    }
    return FromGrpcStatus(reader->Finish());
  }

  std::unique_ptr<RollpackServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<RollpackClient> client_;
};

struct BadCase {
  std::string origin;  // what produced it in the field
  std::string what;    // the malformation
  absl::StatusCode code;
  std::vector<std::string> names;  // the message must contain each
  std::function<absl::Status(BadInputTest*)> send;
};

const char* CodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case absl::StatusCode::kNotFound: return "NOT_FOUND";
    case absl::StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case absl::StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case absl::StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case absl::StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    default: return "OTHER";
  }
}

std::vector<BadCase> Corpus() {
  using C = absl::StatusCode;
  std::vector<BadCase> c;
  auto sample = [&](std::string origin, std::string what, C code, std::vector<std::string> names,
                    std::function<void(v1::Sample*)> edit) {
    c.push_back({origin, what, code, names, [edit](BadInputTest* t) {
                   v1::Sample s = Good("bad", 40);
                   edit(&s);
                   return t->Put(s);
                 }});
  };
  // ---- routed experts
  sample("engine returned n + 1 rows (prompt+output off by one)", "routed_experts has n + 1 rows",
         C::kInvalidArgument, {"sample \"bad\"", "routed_experts", "41 rows"}, [](v1::Sample* s) {
           v1::NDArray* re = s->mutable_routed_experts();
           re->set_shape(0, 41);
           const std::string row = re->data().substr(0, kLayers * kTopk * 4);
           re->mutable_data()->append(row + row);
         });
  sample("engine dropped the last two rows", "routed_experts has n - 2 rows", C::kInvalidArgument,
         {"sample \"bad\"", "routed_experts", "38 rows"}, [](v1::Sample* s) {
           v1::NDArray* re = s->mutable_routed_experts();
           re->set_shape(0, 38);
           re->mutable_data()->resize(38 * kLayers * kTopk * 4);
         });
  sample("capture hook not installed on one MoE layer", "MoE layer 2 is all zeros",
         C::kInvalidArgument, {"sample \"bad\"", "layer 2", "zero"}, [](v1::Sample* s) {
           for (int64_t r = 0; r < 39; ++r)
             for (int k = 0; k < kTopk; ++k) *Expert(s, r, 2, k) = 0;
         });
  sample("top-k with replacement bug", "an expert id repeated within a row",
         C::kInvalidArgument, {"sample \"bad\"", "row 5", "repeats expert id"},
         [](v1::Sample* s) { *Expert(s, 5, 1, 1) = *Expert(s, 5, 1, 0); });
  sample("expert ids of another model (E = 128 engine, E = 64 pool)", "expert id >= E",
         C::kInvalidArgument, {"sample \"bad\"", "64"}, [](v1::Sample* s) { *Expert(s, 3, 0, 2) = 100; });
  sample("negative id from an uninitialised buffer", "expert id -7", C::kInvalidArgument,
         {"sample \"bad\"", "-7"}, [](v1::Sample* s) { *Expert(s, 3, 0, 2) = -7; });
  sample("padding row partly filled with -1", "a row partly -1", C::kInvalidArgument,
         {"sample \"bad\"", "-1", "row 9"}, [](v1::Sample* s) {
           for (int l = 0; l < kLayers; ++l) *Expert(s, 9, l, 0) = -1;
         });
  sample("producer narrowed to uint8 without checking E", "uint8 routed experts for E = 300",
         C::kInvalidArgument, {"sample \"bad\"", "uint8", "300"}, [](v1::Sample*) {});
  c.back().send = [](BadInputTest* t) {
    v1::Sample s = Good("bad", 40, 300);
    v1::NDArray* re = s.mutable_routed_experts();
    std::string narrow;
    const int32_t* ids = reinterpret_cast<const int32_t*>(re->data().data());
    for (size_t i = 0; i < re->data().size() / 4; ++i) narrow.push_back(static_cast<char>(ids[i]));
    re->set_dtype(v1::UINT8);
    re->set_data(narrow);
    return t->Put("wide", {s});
  };
  sample("engine exported only the MoE layers minus one", "layer axis of 3 (model has 4)",
         C::kInvalidArgument, {"sample \"bad\"", "routed_experts", "3"}, [](v1::Sample* s) {
           v1::NDArray* re = s->mutable_routed_experts();
           re->set_shape(1, 3);
           re->mutable_data()->resize(39 * 3 * kTopk * 4);
         });
  sample("top-k mismatch (engine ran top-2)", "last axis 2, model topk 4", C::kInvalidArgument,
         {"sample \"bad\"", "routed_experts", "4"}, [](v1::Sample* s) {
           v1::NDArray* re = s->mutable_routed_experts();
           re->set_shape(2, 2);
           re->mutable_data()->resize(39 * kLayers * 2 * 4);
         });
  sample("logits dumped instead of ids", "float32 routed experts", C::kInvalidArgument,
         {"sample \"bad\"", "routed_experts", "float32"},
         [](v1::Sample* s) { s->mutable_routed_experts()->set_dtype(v1::FLOAT32); });
  sample("flattened [rows, L*K] array", "routed experts of rank 2", C::kInvalidArgument,
         {"sample \"bad\"", "routed_experts"}, [](v1::Sample* s) {
           v1::NDArray* re = s->mutable_routed_experts();
           re->clear_shape();
           re->add_shape(39);
           re->add_shape(kLayers * kTopk);
         });
  sample("routed experts left out for a MoE pool", "no routed_experts", C::kInvalidArgument,
         {"sample \"bad\"", "routed_experts"}, [](v1::Sample* s) { s->clear_routed_experts(); });
  sample("row offset computed from a negative prompt length", "routed_experts_row_offset -3",
         C::kInvalidArgument, {"sample \"bad\"", "-3"},
         [](v1::Sample* s) { s->set_routed_experts_row_offset(-3); });
  // ---- arrays and token fields
  sample("detokenizer dropped the EOS logprob", "token field of length n - 1", C::kInvalidArgument,
         {"sample \"bad\"", "logprobs", "39"}, [](v1::Sample* s) {
           v1::NDArray& lp = (*s->mutable_token_fields())["logprobs"];
           lp.set_shape(0, 39);
           lp.mutable_data()->resize(39 * 4);
         });
  sample("truncated network buffer", "NDArray byte length does not match its shape",
         C::kInvalidArgument, {"sample \"bad\"", "tokens", "159"},
         [](v1::Sample* s) { s->mutable_tokens()->mutable_data()->pop_back(); });
  sample("sign bug in a shape computation", "negative shape", C::kInvalidArgument,
         {"sample \"bad\"", "tokens", "-40"}, [](v1::Sample* s) { s->mutable_tokens()->set_shape(0, -40); });
  sample("uninitialised shape", "shape whose element count overflows", C::kInvalidArgument,
         {"sample \"bad\"", "routed_experts"}, [](v1::Sample* s) {
           s->mutable_routed_experts()->set_shape(0, int64_t{1} << 40);
           s->mutable_routed_experts()->set_shape(1, int64_t{1} << 40);
         });
  sample("newer client with a dtype this server does not know", "unknown dtype 42",
         C::kInvalidArgument, {"sample \"bad\"", "42"},
         [](v1::Sample* s) { s->mutable_tokens()->set_dtype(static_cast<v1::DType>(42)); });
  sample("token ids sent as int64 by numpy default", "int64 tokens", C::kInvalidArgument,
         {"sample \"bad\"", "tokens", "int64"}, [](v1::Sample* s) {
           s->mutable_tokens()->set_dtype(v1::INT64);
           s->mutable_tokens()->mutable_data()->append(160, '\0');
         });
  sample("empty completion", "zero tokens", C::kInvalidArgument, {"sample \"bad\"", "tokens"},
         [](v1::Sample* s) {
           s->mutable_tokens()->set_shape(0, 0);
           s->mutable_tokens()->clear_data();
         });
  sample("request id not propagated", "empty sample_id", C::kInvalidArgument, {"sample_id"},
         [](v1::Sample* s) { s->clear_sample_id(); });
  sample("logprobs in fp64 from another engine version", "token field dtype differs from the pool's",
         C::kInvalidArgument, {"sample \"bad\"", "logprobs", "float32"}, [](v1::Sample* s) {
           v1::NDArray& lp = (*s->mutable_token_fields())["logprobs"];
           lp.set_dtype(v1::INT64);
           lp.mutable_data()->resize(40 * 8);
         });
  sample("engine restarted without the logprobs option", "token field missing from a pool that has it",
         C::kInvalidArgument, {"sample \"bad\"", "logprobs", "missing"},
         [](v1::Sample* s) { s->mutable_token_fields()->erase("logprobs"); });
  // ---- pools, ids, models
  c.push_back({"producer configured with a typo'd pool", "unregistered pool", C::kNotFound,
               {"pool \"qwen\""}, [](BadInputTest* t) { return t->Put("qwen", {Good("x", 40)}); }});
  c.push_back({"retry after the engine re-sampled", "stored sample id sent with other content",
               C::kAlreadyExists, {"sample \"s5\"", "different content"}, [](BadInputTest* t) {
                 v1::Sample s = Good("s5", 64 + 8 * 5);
                 *Expert(&s, 0, 0, 0) = 63;
                 return t->Put(s);
               }});
  c.push_back({"two engines sharing a request counter", "one request repeats an id with other content",
               C::kInvalidArgument, {"sample \"dup\"", "twice"}, [](BadInputTest* t) {
                 return t->Put("p", {Good("dup", 40), Good("dup", 48)});
               }});
  c.push_back({"a good sample followed by a bad one in one message", "all or nothing per message",
               C::kInvalidArgument, {"sample \"b2\""}, [](BadInputTest* t) {
                 v1::Sample bad = Good("b2", 40);
                 *Expert(&bad, 1, 1, 1) = 1000;
                 return t->Put("p", {Good("b1", 40), bad});
               }});
  c.push_back({"deployment re-registered with another checkpoint's config", "model changed for a pool",
               C::kFailedPrecondition, {"pool \"p\"", "another spec"}, [](BadInputTest* t) {
                 v1::ModelSpec m = Model();
                 m.set_topk(8);
                 return t->client_->RegisterModel("p", m).status();
               }});
  c.push_back({"config with top-k > E", "invalid model spec", C::kInvalidArgument, {"topk"},
               [](BadInputTest* t) {
                 v1::ModelSpec m = Model();
                 m.set_topk(99);
                 return t->client_->RegisterModel("other", m).status();
               }});
  c.push_back({"MoE layer list from another model", "moe layer >= num_layers", C::kInvalidArgument,
               {"moe_layers", "9"}, [](BadInputTest* t) {
                 v1::ModelSpec m = Model();
                 m.add_moe_layers(1);
                 m.add_moe_layers(9);
                 return t->client_->RegisterModel("other", m).status();
               }});
  // ---- steps and topologies
  c.push_back({"pp=3 for a 4-layer model", "layers not divisible by pp*vpp", C::kInvalidArgument,
               {"4", "3"}, [](BadInputTest* t) {
                 return t->Create([](v1::CreateStepRequest* r) { r->mutable_topology()->set_pp(3); });
               }});
  c.push_back({"vpp=4 with pp=2 for a 4-layer model", "layers not divisible by pp*vpp",
               C::kInvalidArgument, {"4"}, [](BadInputTest* t) {
                 return t->Create([](v1::CreateStepRequest* r) {
                   r->mutable_topology()->set_pp(2);
                   r->mutable_topology()->set_vpp(4);
                 });
               }});
  c.push_back({"budget set for a shorter max length", "sequence longer than the largest CP group allows",
               C::kInvalidArgument, {"sample \"s10\"", "144 tokens", "largest CP group"},
               [](BadInputTest* t) {
                 return t->Create([](v1::CreateStepRequest* r) {
                   r->set_num_samples(0);
                   r->add_sample_ids("s10");
                   r->add_sample_ids("s11");
                   r->mutable_topology()->set_max_tokens_per_rank(128);
                 });
               }});
  c.push_back({"launcher passed -1 for an unset size", "negative dp", C::kInvalidArgument, {"dp", "-1"},
               [](BadInputTest* t) {
                 return t->Create([](v1::CreateStepRequest* r) { r->mutable_topology()->set_dp(-1); });
               }});
  c.push_back({"budget left at 0", "max_tokens_per_rank 0", C::kInvalidArgument,
               {"max_tokens_per_rank"}, [](BadInputTest* t) {
                 return t->Create(
                     [](v1::CreateStepRequest* r) { r->mutable_topology()->set_max_tokens_per_rank(0); });
               }});
  c.push_back({"controller and producer disagree on the pool", "step over an unregistered pool",
               C::kNotFound, {"pool \"nope\""}, [](BadInputTest* t) {
                 return t->Create([](v1::CreateStepRequest* r) { r->set_pool("nope"); });
               }});
  c.push_back({"controller lists a sample the producer never acknowledged", "unknown sample id",
               C::kNotFound, {"sample \"ghost\""}, [](BadInputTest* t) {
                 return t->Create([](v1::CreateStepRequest* r) {
                   r->set_num_samples(0);
                   r->add_sample_ids("s4");
                   r->add_sample_ids("ghost");
                 });
               }});
  c.push_back({"controller reuses a sample of the live step", "sample already in a live step",
               C::kFailedPrecondition, {"sample \"s0\"", "live step"}, [](BadInputTest* t) {
                 return t->Create([](v1::CreateStepRequest* r) {
                   r->set_num_samples(0);
                   r->add_sample_ids("s4");
                   r->add_sample_ids("s0");
                 });
               }});
  c.push_back({"controller retried CreateStep after a timeout", "step id already exists",
               C::kAlreadyExists, {"step \"live\""}, [](BadInputTest* t) {
                 return t->Create([](v1::CreateStepRequest* r) { r->set_step_id("live"); });
               }});
  c.push_back({"controller asks for a global batch the pool does not have", "too few free samples",
               C::kFailedPrecondition, {"10 free samples", "500 requested"}, [](BadInputTest* t) {
                 return t->Create([](v1::CreateStepRequest* r) { r->set_num_samples(500); });
               }});
  // ---- fetch and release
  c.push_back({"trainer restarted against a fresh server", "fetch for an unknown step", C::kNotFound,
               {"step \"gone\""}, [](BadInputTest* t) { return t->Fetch("gone", 0, 0); }});
  c.push_back({"trainer launched with a larger world size", "fetch for an out-of-range rank",
               C::kInvalidArgument, {"dp", "5"}, [](BadInputTest* t) { return t->Fetch("live", 5, 0); }});
  c.push_back({"resume index past the end", "start_index out of range", C::kOutOfRange,
               {"start_index 77"}, [](BadInputTest* t) { return t->Fetch("live", 0, 77); }});
  c.push_back({"double release after a retry", "release of an unknown step", C::kNotFound,
               {"step \"never\""}, [](BadInputTest* t) { return t->client_->ReleaseStep("never").status(); }});
  return c;
}

TEST_F(BadInputTest, EveryCaseGetsItsCodeAndNamesTheProblemAndChangesNothing) {
  const std::vector<BadCase> corpus = Corpus();
  ASSERT_GE(corpus.size(), 30u);
  std::string table =
      "| # | origin | malformation | status | the message names |\n|---|---|---|---|---|\n";
  const Snapshot before = Take();
  for (size_t i = 0; i < corpus.size(); ++i) {
    const BadCase& c = corpus[i];
    SCOPED_TRACE("case " + std::to_string(i + 1) + ": " + c.what);
    const absl::Status s = c.send(this);
    EXPECT_EQ(s.code(), c.code) << s;
    for (const std::string& name : c.names) EXPECT_THAT(std::string(s.message()), HasSubstr(name));
    EXPECT_TRUE(Take() == before) << "state changed:\n" << Take().text << "\nwas\n" << before.text;
    std::string names;
    for (const std::string& n : c.names) names += (names.empty() ? "`" : ", `") + n + "`";
    table += "| " + std::to_string(i + 1) + " | " + c.origin + " | " + c.what + " | " +
             CodeName(c.code) + " | " + names + " |\n";
  }
  // Still serving: a good put, a step, every rank fetched.
  ASSERT_TRUE(Put(Good("after", 40)).ok());
  ASSERT_TRUE(Create([](v1::CreateStepRequest* r) { r->set_step_id("after"); }).ok());
  EXPECT_TRUE(Fetch("after", 0, 0).ok());
  EXPECT_TRUE(Fetch("after", 1, 0).ok());
  EXPECT_TRUE(Fetch("live", 1, 0).ok());
  if (const char* path = std::getenv("ROLLPACK_BAD_INPUT_TABLE")) std::ofstream(path) << table;
}

}  // namespace
}  // namespace rollpack
