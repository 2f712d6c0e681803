// The capture port end to end (shared/spec/capture.md): a stand-in vLLM or
// SGLang server (testing/standin_engine.py, written from the engines'
// documented formats) behind a real rollpackd with --capture-*, driven over
// HTTP as a rollout worker would, and read back as a trainer would.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "simdjson.h"
#include "testing/daemon_process.h"
#include "testing/rank_fetch.h"
#include "testing/reference_layout.h"
#include "testing/standin_engine.h"
#include "testing/standin_outputs.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kPython[] = "/usr/bin/python3";
constexpr int kLayers = 4, kExperts = 8, kTopk = 2;

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("standin-moe");
  m.set_num_layers(kLayers);
  m.set_num_experts(kExperts);
  m.set_topk(kTopk);
  return m;
}

// `json` re-serialized with object members named in `drop` left out
// (anywhere), so two bodies compare as JSON whatever their whitespace.
std::string Canonical(simdjson::dom::element e, const std::set<std::string>& drop) {
  switch (e.type()) {
    case simdjson::dom::element_type::OBJECT: {
      std::vector<std::string> members;
      for (auto [key, value] : simdjson::dom::object(e)) {
        if (drop.count(std::string(key)) > 0) continue;
        members.push_back(absl::StrCat("\"", std::string(key), "\":", Canonical(value, drop)));
      }
      return absl::StrCat("{", absl::StrJoin(members, ","), "}");
    }
    case simdjson::dom::element_type::ARRAY: {
      std::vector<std::string> items;
      for (simdjson::dom::element item : simdjson::dom::array(e)) {
        items.push_back(Canonical(item, drop));
      }
      return absl::StrCat("[", absl::StrJoin(items, ","), "]");
    }
    default:
      return simdjson::to_string(e);
  }
}

std::string Canonical(const std::string& json, const std::set<std::string>& drop = {}) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(json).get(root) != simdjson::SUCCESS) return "not JSON: " + json;
  return Canonical(root, drop);
}

class CaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/capture_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
    std::ofstream(dir_ + "/model.json")
        << R"({"name": "standin-moe", "numLayers": 4, "numExperts": 8, "topk": 2})";
  }

  // A stand-in `engine` with `engine_args`, and rollpackd in front of it.
  void Start(const std::string& engine, std::vector<std::string> engine_args = {},
             std::vector<std::string> daemon_args = {}) {
    engine_args.insert(engine_args.begin(), {"--engine", engine});
    absl::StatusOr<std::unique_ptr<StandinEngine>> standin =
        StandinEngine::Start(kPython, STANDIN_ENGINE_PATH, engine_args);
    ASSERT_TRUE(standin.ok()) << standin.status();
    engine_ = *std::move(standin);
    daemon_args.insert(daemon_args.end(),
                       {"--capture-listen=127.0.0.1:0", "--capture-upstream=" + engine_->url(),
                        "--capture-engine=" + engine, "--capture-pool=rollouts",
                        "--capture-model=" + dir_ + "/model.json",
                        "--capture-port-file=" + dir_ + "/capture_port"});
    absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
        DaemonProcess::Start(ROLLPACKD_PATH, daemon_args, dir_ + "/port");
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    std::ifstream(dir_ + "/capture_port") >> capture_port_;
    ASSERT_GT(capture_port_, 0);
    client_ = std::make_unique<RollpackClient>(daemon_->address());
  }

  httplib::Result Post(const std::string& path, const std::string& body,
                       httplib::Headers headers = {}) {
    httplib::Client http("127.0.0.1", capture_port_);
    http.set_read_timeout(30, 0);
    return http.Post(path, headers, body, "application/json");
  }

  httplib::Result PostToEngine(const std::string& path, const std::string& body) {
    httplib::Client http("127.0.0.1", engine_->port());
    http.set_read_timeout(30, 0);
    return http.Post(path, body, "application/json");
  }

  int64_t PoolSamples() {
    absl::StatusOr<v1::PoolInfo> pool = client_->GetPool("rollouts");
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? pool->num_samples() : -1;
  }

  // Takes `expected` out of the pool in one step and checks every byte a
  // trainer rank gets against the reference layout of the samples as a
  // producer would have put them.
  // `fetched`, when given, receives the micro-batches.
  void ExpectStored(const std::vector<v1::Sample>& expected,
                    std::vector<v1::Microbatch>* fetched = nullptr) {
    v1::CreateStepRequest create;
    create.set_step_id(absl::StrCat("verify-", ++steps_));
    create.set_pool("rollouts");
    std::map<std::string, const v1::Sample*> by_id;
    for (const v1::Sample& s : expected) {
      create.add_sample_ids(s.sample_id());
      by_id[s.sample_id()] = &s;
    }
    create.mutable_topology()->set_dp(1);
    create.mutable_topology()->set_max_tokens_per_rank(4096);
    absl::StatusOr<v1::StepInfo> step = client_->CreateStep(create);
    ASSERT_TRUE(step.ok()) << step.status();
    absl::StatusOr<v1::Plan> plan = client_->GetPlan(create.step_id());
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<std::vector<v1::Microbatch>> mbs =
        FetchRankMicrobatches(daemon_->address(), create.step_id(), v1::RankCoords());
    ASSERT_TRUE(mbs.ok()) << mbs.status();
    ASSERT_EQ(static_cast<int>(mbs->size()), plan->microbatches_size());
    for (const v1::Microbatch& mb : *mbs) {
      absl::StatusOr<ExpectedMicrobatch> want =
          ReferenceMicrobatch(*plan, Model(), by_id, v1::RankCoords(), mb.index());
      ASSERT_TRUE(want.ok()) << want.status();
      absl::Status check =
          CheckMicrobatch(mb, *want, plan->topology(), v1::RankCoords(), Model(), true);
      EXPECT_TRUE(check.ok()) << check;
    }
    if (fetched != nullptr) *fetched = *std::move(mbs);
  }

  std::string dir_;
  std::unique_ptr<StandinEngine> engine_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<RollpackClient> client_;
  int capture_port_ = 0;
  int steps_ = 0;
};

// vLLM writes every response field, null when not asked: the client gets
// them as the engine would have answered its request, minus the routing.
const std::set<std::string> kVllmRouting = {"routed_experts"};

TEST_F(CaptureTest, VllmCompletionsChoicesAreStoredAsAGroupWithTheEnginesBytes) {
  Start("vllm");
  const std::string request =
      R"({"model": "standin-moe", "prompt": [101, 7, 2024, 55, 9], "max_tokens": 6, "n": 2})";
  httplib::Result direct = PostToEngine("/v1/completions", request);
  ASSERT_TRUE(direct);
  httplib::Result captured = Post("/v1/completions", request, {{"X-Rollpack-Policy-Version", "3"}});
  ASSERT_TRUE(captured);
  ASSERT_EQ(captured->status, 200) << captured->body;
  EXPECT_EQ(captured->get_header_value("X-Rollpack-Capture"), "stored");
  simdjson::dom::parser parser;
  const std::string id = std::string(parser.parse(direct->body)["id"].get_string().value());
  EXPECT_EQ(captured->get_header_value("X-Rollpack-Sample-Ids"),
            absl::StrCat(id, "#0,", id, "#1"));
  EXPECT_EQ(Canonical(captured->body), Canonical(direct->body, kVllmRouting));
  EXPECT_THAT(captured->body, ::testing::Not(HasSubstr("routed_experts")));
  EXPECT_EQ(PoolSamples(), 2);

  std::vector<v1::Sample> expected;
  for (int i = 0; i < 2; ++i) {
    expected.push_back(StandinChoiceSample(absl::StrCat(id, "#", i), {101, 7, 2024, 55, 9}, i, 6));
  }
  ExpectStored(expected);
}

TEST_F(CaptureTest, VllmChatClientGetsExactlyWhatItAskedFor) {
  Start("vllm");
  for (const std::string request : {
           // Nothing asked: token ids and logprobs stay null for the client.
           std::string(R"({"model": "standin-moe", "max_tokens": 4,
               "messages": [{"role": "user", "content": "hello"}]})"),
           // Logprobs asked with alternatives: the client's own values stand.
           std::string(R"({"model": "standin-moe", "max_tokens": 4, "logprobs": true,
               "top_logprobs": 2, "messages": [{"role": "user", "content": "hi there"}]})"),
       }) {
    httplib::Result direct = PostToEngine("/v1/chat/completions", request);
    httplib::Result captured = Post("/v1/chat/completions", request);
    ASSERT_TRUE(direct && captured);
    ASSERT_EQ(captured->status, 200) << captured->body;
    EXPECT_EQ(captured->get_header_value("X-Rollpack-Capture"), "stored") << request;
    EXPECT_EQ(Canonical(captured->body), Canonical(direct->body, kVllmRouting)) << request;
  }
  EXPECT_EQ(PoolSamples(), 2);
}

TEST_F(CaptureTest, SglangGenerateListOfChoicesIsStoredAndStrippedOfWhatTheProxyAsked) {
  Start("sglang");
  const std::string request =
      R"({"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 3, "n": 3}})";
  httplib::Result direct = PostToEngine("/generate", request);
  httplib::Result captured = Post("/generate", request, {{"X-Rollpack-Group-Id", "prompt-1"}});
  ASSERT_TRUE(direct && captured);
  ASSERT_EQ(captured->status, 200) << captured->body;
  EXPECT_EQ(captured->get_header_value("X-Rollpack-Capture"), "stored");
  // SGLang leaves out what is not asked: the bodies are the same JSON.
  EXPECT_EQ(Canonical(captured->body), Canonical(direct->body));
  const std::vector<std::string> ids =
      absl::StrSplit(captured->get_header_value("X-Rollpack-Sample-Ids"), ',');
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(PoolSamples(), 3);
}

TEST_F(CaptureTest, ACaptureFailureNeverChangesWhatTheClientGets) {
  Start("vllm", {}, {"--capture-timeout-seconds=2"});
  const std::string request =
      R"({"model": "standin-moe", "prompt": [1, 2, 3], "max_tokens": 2})";
  // An unregistered pool: the engine's answer, not stored, named.
  httplib::Result unregistered = Post("/v1/completions", request, {{"X-Rollpack-Pool", "nope"}});
  ASSERT_TRUE(unregistered);
  EXPECT_EQ(unregistered->status, 200);
  EXPECT_THAT(unregistered->get_header_value("X-Rollpack-Capture"),
              AllOf(StartsWith("not-stored; "), HasSubstr("nope")));
  EXPECT_EQ(Canonical(unregistered->body),
            Canonical(PostToEngine("/v1/completions", request)->body, kVllmRouting));

  // The engine's own error passes through unchanged; nothing is stored.
  const std::string failing =
      R"({"model": "standin-moe", "prompt": [1, 2, 3], "max_tokens": 2, "standin_error": 503})";
  httplib::Result error = Post("/v1/completions", failing);
  httplib::Result direct_error = PostToEngine("/v1/completions", failing);
  ASSERT_TRUE(error && direct_error);
  EXPECT_EQ(error->status, 503);
  EXPECT_EQ(error->body, direct_error->body);
  EXPECT_THAT(error->get_header_value("X-Rollpack-Capture"), HasSubstr("status 503"));

  // An aborted request (no routing): answered, not stored.
  httplib::Result no_routing = Post(
      "/v1/completions",
      R"({"model": "standin-moe", "prompt": [1, 2], "max_tokens": 2, "standin_drop_routing": true})");
  ASSERT_TRUE(no_routing);
  EXPECT_EQ(no_routing->status, 200);
  EXPECT_THAT(no_routing->get_header_value("X-Rollpack-Capture"),
              HasSubstr("routed_experts is null"));

  // Malformed headers: 400 before anything is forwarded.
  httplib::Result malformed =
      Post("/v1/completions", request, {{"X-Rollpack-Policy-Version", "v2"}});
  ASSERT_TRUE(malformed);
  EXPECT_EQ(malformed->status, 400);
  EXPECT_THAT(malformed->body, HasSubstr("X-Rollpack-Policy-Version"));

  // The engine too slow: 504 naming the upstream.
  httplib::Result slow = Post(
      "/v1/completions",
      R"({"model": "standin-moe", "prompt": [1], "max_tokens": 1, "standin_sleep_ms": 4000})");
  ASSERT_TRUE(slow);
  EXPECT_EQ(slow->status, 504);
  EXPECT_THAT(slow->body, AllOf(HasSubstr("rollpack_upstream"), HasSubstr(engine_->url())));
  EXPECT_EQ(PoolSamples(), 0);

  // The engine gone: 502.
  engine_->Kill();
  httplib::Result gone = Post("/v1/completions", request);
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->status, 502);
  EXPECT_THAT(gone->body, HasSubstr("rollpack_upstream"));
}

TEST_F(CaptureTest, OtherRequestsAndOpenAiStreamsPassThroughAsTheyArrive) {
  Start("vllm", {"--stream-interval-ms", "150"});
  httplib::Client http("127.0.0.1", capture_port_);
  httplib::Result models = http.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_THAT(models->body, HasSubstr("standin-moe"));
  EXPECT_EQ(models->get_header_value("X-Rollpack-Capture"), "");

  const std::string request = R"({"model": "standin-moe", "prompt": [3, 4], "max_tokens": 6,
      "stream": true})";
  std::vector<std::chrono::steady_clock::time_point> arrivals;
  std::string streamed;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = request;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    arrivals.push_back(std::chrono::steady_clock::now());
    streamed.append(data, size);
    return true;
  };
  httplib::Result result = http.send(req);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  httplib::Client direct("127.0.0.1", engine_->port());
  httplib::Result direct_stream = direct.Post("/v1/completions", request, "application/json");
  ASSERT_TRUE(direct_stream);
  EXPECT_EQ(streamed, direct_stream->body);
  EXPECT_THAT(streamed, HasSubstr("data: [DONE]"));
  // Events were passed on as the engine sent them, 150 ms apart, not
  // buffered to the end.
  ASSERT_GE(arrivals.size(), 3u);
  EXPECT_GT(arrivals.back() - arrivals.front(), std::chrono::milliseconds(450));
  EXPECT_EQ(PoolSamples(), 0);
}

TEST_F(CaptureTest, OversizedRequestsAreRefusedAndTokensChecked) {
  {
    std::ofstream(dir_ + "/tokens") << "producer producer-token-0123456789\n"
                                    << "trainer trainer-token-0123456789\n";
  }
  chmod((dir_ + "/tokens").c_str(), 0600);
  Start("vllm", {}, {"--auth-tokens=" + dir_ + "/tokens", "--capture-max-body-bytes=4096"});
  const std::string request = R"({"model": "standin-moe", "prompt": [1, 2], "max_tokens": 2})";
  httplib::Result missing = Post("/v1/completions", request);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  httplib::Result trainer = Post("/v1/completions", request, {{"X-Rollpack-Token", "trainer-token-0123456789"}});
  ASSERT_TRUE(trainer);
  EXPECT_EQ(trainer->status, 403);
  httplib::Result producer = Post("/v1/completions", request, {{"X-Rollpack-Token", "producer-token-0123456789"}});
  ASSERT_TRUE(producer);
  EXPECT_EQ(producer->status, 200);
  EXPECT_EQ(producer->get_header_value("X-Rollpack-Capture"), "stored");
  httplib::Result oversized = Post(
      "/v1/completions",
      absl::StrCat(R"({"model": "standin-moe", "max_tokens": 2, "prompt": ")",
                   std::string(5000, 'a'), "\"}"),
      {{"X-Rollpack-Token", "producer-token-0123456789"}});
  ASSERT_TRUE(oversized);
  EXPECT_EQ(oversized->status, 413);
}

// The SGLang stand-in writes raw int32 ids.
const StandinModel kSglangModel{4, 8, 2, 32000, 4};

TEST_F(CaptureTest, ASessionsTurnsSealIntoOneSampleWhoseLayoutIsExact) {
  Start("sglang");
  // Turn k's prompt: everything so far, plus a tool result (loss mask 0).
  std::vector<int32_t> tokens, prompt = {10, 11, 12, 13};
  std::vector<uint8_t> loss_mask;
  std::vector<float> logprobs;
  const std::vector<std::vector<int32_t>> tool_results = {{}, {50, 51}, {60}};
  const int max_new[] = {3, 2, 4};
  for (int turn = 0; turn < 3; ++turn) {
    prompt.insert(prompt.end(), tool_results[turn].begin(), tool_results[turn].end());
    const std::string request = absl::StrCat(
        R"({"input_ids": [)", absl::StrJoin(prompt, ","),
        R"(], "sampling_params": {"max_new_tokens": )", max_new[turn], "}}");
    httplib::Headers headers = {{"X-Rollpack-Session", "agent-7"}};
    if (turn == 2) headers.emplace("X-Rollpack-Final", "true");
    httplib::Result r = Post("/generate", request, headers);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("X-Rollpack-Capture"), "stored") << "turn " << turn;
    EXPECT_EQ(r->get_header_value("X-Rollpack-Sample-Ids"), "agent-7");
    // The client's body is the engine's answer to its own request.
    EXPECT_EQ(Canonical(r->body), Canonical(PostToEngine("/generate", request)->body));

    auto [generated, generated_logprobs] = StandinGenerated(prompt, 0, max_new[turn]);
    loss_mask.resize(prompt.size(), 0);
    logprobs.resize(prompt.size(), 0.0f);
    tokens = prompt;
    tokens.insert(tokens.end(), generated.begin(), generated.end());
    loss_mask.insert(loss_mask.end(), generated.size(), 1);
    logprobs.insert(logprobs.end(), generated_logprobs.begin(), generated_logprobs.end());
    prompt = tokens;

    absl::StatusOr<v1::PoolInfo> pool = client_->GetPool("rollouts");
    ASSERT_TRUE(pool.ok());
    EXPECT_EQ(pool->num_open_samples(), turn < 2 ? 1 : 0) << "turn " << turn;
    EXPECT_EQ(pool->num_samples(), turn < 2 ? 0 : 1) << "turn " << turn;
  }
  ExpectStored({StandinSample("agent-7", tokens, loss_mask, logprobs, kSglangModel)});
}

TEST_F(CaptureTest, ASessionTurnThatRewroteHistoryOrOverlapsAnotherIsNotStored) {
  Start("sglang");
  auto turn = [&](const std::string& session, const std::vector<int32_t>& prompt,
                  int sleep_ms = 0) {
    return Post("/generate",
                absl::StrCat(R"({"input_ids": [)", absl::StrJoin(prompt, ","),
                             R"(], "sampling_params": {"max_new_tokens": 2}, "standin_sleep_ms": )",
                             sleep_ms, "}"),
                {{"X-Rollpack-Session", session}});
  };
  httplib::Result first = turn("s", {1, 2, 3});
  ASSERT_TRUE(first);
  EXPECT_EQ(first->get_header_value("X-Rollpack-Capture"), "stored");
  // The harness truncated the history: answered, not stored.
  httplib::Result rewritten = turn("s", {1, 2, 9, 9, 9});
  ASSERT_TRUE(rewritten);
  EXPECT_EQ(rewritten->status, 200);
  EXPECT_THAT(rewritten->get_header_value("X-Rollpack-Capture"),
              HasSubstr("session s: prompt differs from the stored tokens at position 2"));

  // A second turn while one is in flight: answered, not stored.
  std::thread slow([&] {
    httplib::Result r = turn("t", {4, 5}, 1500);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->get_header_value("X-Rollpack-Capture"), "stored");
  });
  absl::SleepFor(absl::Milliseconds(500));
  httplib::Result overlapping = turn("t", {4, 5});
  slow.join();
  ASSERT_TRUE(overlapping);
  EXPECT_THAT(overlapping->get_header_value("X-Rollpack-Capture"),
              HasSubstr("session t: a turn is in flight"));

  // finish seals an open session once; unknown sessions are 404.
  httplib::Result finished = Post("/rollpack/v1/sessions/s/finish", "");
  ASSERT_TRUE(finished);
  EXPECT_EQ(finished->status, 200) << finished->body;
  EXPECT_EQ(Canonical(finished->body), Canonical(R"({"sample_id": "s", "tokens": 5})"));
  httplib::Result again = Post("/rollpack/v1/sessions/s/finish", "");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 409) << again->body;
  httplib::Result unknown = Post("/rollpack/v1/sessions/nobody/finish", "{}");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404) << unknown->body;
  // A sealed session's next turn is answered, not stored.
  httplib::Result after = turn("s", {1, 2, 3, 0, 0});
  ASSERT_TRUE(after);
  EXPECT_THAT(after->get_header_value("X-Rollpack-Capture"), HasSubstr("session s is sealed"));
  absl::StatusOr<v1::PoolInfo> pool = client_->GetPool("rollouts");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_samples(), 1);
  EXPECT_EQ(pool->num_open_samples(), 1);  // "t"
}

// The whole raw HTTP/1.1 exchange of `request` (sent with Connection:
// close) on `port`: headers, chunks and trailers as they came.
std::string RawExchange(int port, const std::string& path, const std::string& body,
                        const std::string& header_line = "") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return "connect failed";
  }
  const std::string request =
      absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n",
                   header_line.empty() ? "" : header_line + "\r\n",
                   "Content-Type: application/json\r\nContent-Length: ", body.size(),
                   "\r\n\r\n", body);
  (void)!write(fd, request.data(), request.size());
  std::string out;
  char buffer[65536];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) out.append(buffer, n);
  close(fd);
  return out;
}

// The body of a raw chunked response (cpp-httplib refuses trailers).
std::string Dechunk(const std::string& raw) {
  size_t at = raw.find("\r\n\r\n");
  if (at == std::string::npos) return "";
  at += 4;
  std::string body;
  for (;;) {
    const size_t line_end = raw.find("\r\n", at);
    if (line_end == std::string::npos) return body;
    const size_t size = std::stoul(raw.substr(at, line_end - at), nullptr, 16);
    if (size == 0) return body;
    body += raw.substr(line_end + 2, size);
    at = line_end + 2 + size + 2;
  }
}

// The JSON of each `data:` event of a server-sent event stream, canonical,
// without `drop`'s members.
std::vector<std::string> Events(const std::string& stream, const std::set<std::string>& drop) {
  std::vector<std::string> events;
  for (absl::string_view line : absl::StrSplit(stream, '\n')) {
    if (!absl::ConsumePrefix(&line, "data: ") || line == "[DONE]") continue;
    events.push_back(Canonical(std::string(line), drop));
  }
  return events;
}

TEST_F(CaptureTest, StreamedGenerationsAreStoredBeforeTheirFinalEventAndNamedInTrailers) {
  Start("vllm");
  const std::string request = R"({"model": "standin-moe", "token_ids": [9, 8, 7, 6],
      "sampling_params": {"max_tokens": 4, "n": 2}, "stream": true})";
  const std::string captured =
      Dechunk(RawExchange(capture_port_, "/inference/v1/generate", request));
  httplib::Result direct = PostToEngine("/inference/v1/generate", request);
  ASSERT_TRUE(direct);
  // Event by event what the engine sent to the request as asked, minus
  // the routing.
  EXPECT_EQ(Events(captured, {}), Events(direct->body, kVllmRouting));
  EXPECT_THAT(captured, HasSubstr("data: [DONE]"));
  EXPECT_THAT(captured, ::testing::Not(HasSubstr("routed_experts")));
  simdjson::dom::parser parser;
  const std::string first_event = Events(direct->body, {}).front();
  const std::string id =
      std::string(parser.parse(first_event)["request_id"].get_string().value());
  ExpectStored({StandinChoiceSample(absl::StrCat(id, "#0"), {9, 8, 7, 6}, 0, 4),
                StandinChoiceSample(absl::StrCat(id, "#1"), {9, 8, 7, 6}, 1, 4)});

  // The outcome comes as trailers: the headers left before it was known.
  const std::string raw = RawExchange(
      capture_port_, "/inference/v1/generate",
      R"({"model": "standin-moe", "token_ids": [1, 2], "sampling_params": {"max_tokens": 2},
          "stream": true})");
  EXPECT_THAT(raw, HasSubstr("Trailer: X-Rollpack-Sample-Ids, X-Rollpack-Capture"));
  EXPECT_THAT(raw, HasSubstr("\r\n0\r\nX-Rollpack-Sample-Ids: generate-tokens-"));
  EXPECT_THAT(raw, HasSubstr("X-Rollpack-Capture: stored\r\n"));
}

TEST_F(CaptureTest, SglangStreamedBatchItemsAreStoredUngroupedWithTheirOwnPrompts) {
  Start("sglang");
  const std::string request = R"({"input_ids": [[3, 1, 4], [1, 5, 9, 2]],
      "sampling_params": {"max_new_tokens": 3}, "stream": true})";
  const std::string captured = Dechunk(RawExchange(capture_port_, "/generate", request));
  httplib::Result direct = PostToEngine("/generate", request);
  ASSERT_TRUE(direct);
  EXPECT_EQ(Events(captured, {}), Events(direct->body, {}));
  absl::StatusOr<v1::PoolInfo> pool = client_->GetPool("rollouts");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_samples(), 2);
  simdjson::dom::parser parser;
  const std::string first = Events(direct->body, {}).front();
  const std::string item0 =
      std::string(parser.parse(first)["meta_info"]["id"].get_string().value());
  ExpectStored(
      {StandinChoiceSample(absl::StrCat(item0, "#0"), {3, 1, 4}, 0, 3, kSglangModel),
       StandinChoiceSample(absl::StrCat(item0, "#1"), {1, 5, 9, 2}, 0, 3, kSglangModel)});
}

// An engine whose model is not the pool's: each mismatch answered as the
// engine answered, not stored, and named.
TEST_F(CaptureTest, RoutingThePoolsModelDoesNotAllowIsNotStoredAndNamed) {
  struct Case {
    std::vector<std::string> engine_args;
    std::string why;
  };
  const Case cases[] = {
      {{"--num-layers", "5"}, "5 layers"},
      {{"--topk", "3"}, "3 experts per token"},
      {{"--num-experts", "300"}, "expert"},
  };
  for (const Case& c : cases) {
    Start("vllm", c.engine_args);
    const std::string request =
        R"({"model": "standin-moe", "prompt": [1, 2, 3], "max_tokens": 3})";
    httplib::Result r = Post("/v1/completions", request);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_THAT(r->get_header_value("X-Rollpack-Capture"),
                AllOf(StartsWith("not-stored; "), HasSubstr("routed_experts"), HasSubstr(c.why)))
        << c.why;
    EXPECT_EQ(Canonical(r->body),
              Canonical(PostToEngine("/v1/completions", request)->body, kVllmRouting));
    EXPECT_EQ(PoolSamples(), 0);
  }
}

// A broken routing payload: answered, not stored, named, the pool unchanged.
TEST_F(CaptureTest, MalformedRoutingOrAWrongDtypeIsNotStoredAndNamed) {
  Start("vllm");
  struct Case {
    const char* corrupt;
    const char* why;
  };
  for (const Case& c : {Case{"base64", "base64"}, Case{"dtype", "<f4"},
                        Case{"shape", "rows"}}) {
    const std::string request = absl::StrCat(
        R"({"model": "standin-moe", "prompt": [5, 6, 7], "max_tokens": 3, )",
        R"("standin_corrupt_routing": ")", c.corrupt, R"("})");
    httplib::Result r = Post("/v1/completions", request);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_THAT(r->get_header_value("X-Rollpack-Capture"),
                AllOf(StartsWith("not-stored; INVALID_ARGUMENT"), HasSubstr("routed_experts"),
                      HasSubstr(c.why)))
        << c.corrupt;
    EXPECT_EQ(Canonical(r->body),
              Canonical(PostToEngine("/v1/completions", request)->body, kVllmRouting))
        << c.corrupt;
  }
  EXPECT_EQ(PoolSamples(), 0);
}

TEST_F(CaptureTest, AFullStoreOrAnOversizedAnswerLeavesTheResponseAndThePoolAsTheyWere) {
  Start("vllm", {}, {"--max-memory=6000", "--capture-max-body-bytes=20000",
                     "--metrics-listen=127.0.0.1:0", "--metrics-port-file=" + dir_ + "/mport"});
  int stored = 0;
  std::string full;
  for (int i = 0; i < 40 && full.empty(); ++i) {
    const std::string request = absl::StrCat(
        R"({"model": "standin-moe", "prompt": [1, 2, )", i, R"(], "max_tokens": 8})");
    httplib::Result r = Post("/v1/completions", request);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    const std::string capture = r->get_header_value("X-Rollpack-Capture");
    if (capture == "stored") {
      ++stored;
    } else {
      full = capture;
      EXPECT_EQ(Canonical(r->body),
                Canonical(PostToEngine("/v1/completions", request)->body, kVllmRouting));
    }
  }
  EXPECT_GT(stored, 0);
  EXPECT_THAT(full, AllOf(StartsWith("not-stored; RESOURCE_EXHAUSTED"), HasSubstr("memory")));
  EXPECT_EQ(PoolSamples(), stored);

  // Larger than --capture-max-body-bytes: passed through as the engine
  // sent it, routing included.
  const std::string large =
      R"({"model": "standin-moe", "prompt": [7, 7, 7], "max_tokens": 600})";
  httplib::Result r = Post("/v1/completions", large);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->get_header_value("X-Rollpack-Capture"),
              AllOf(StartsWith("not-stored; RESOURCE_EXHAUSTED"),
                    HasSubstr("--capture-max-body-bytes")));
  // As the engine sent it to the request as forwarded: too large to be read,
  // it keeps what the capture fields added (spec section 4).
  simdjson::dom::parser parser;
  simdjson::dom::element passed;
  ASSERT_EQ(parser.parse(r->body).get(passed), simdjson::SUCCESS);
  EXPECT_TRUE(passed["choices"].at(0)["routed_experts"].is_string());
  EXPECT_TRUE(passed["choices"].at(0)["token_ids"].is_array());
  EXPECT_EQ(PoolSamples(), stored);

  // Every outcome is counted.
  int metrics_port = 0;
  std::ifstream(dir_ + "/mport") >> metrics_port;
  httplib::Client scrape("127.0.0.1", metrics_port);
  httplib::Result metrics = scrape.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body,
              HasSubstr(absl::StrCat("rollpack_capture_requests_total{endpoint=\"vllm "
                                     "/v1/completions\",result=\"stored\"} ",
                                     stored)));
  EXPECT_THAT(metrics->body, HasSubstr(absl::StrCat("rollpack_capture_samples_total ", stored)));
  EXPECT_THAT(metrics->body, HasSubstr("rollpack_capture_overhead_seconds_count"));
  EXPECT_THAT(metrics->body, HasSubstr("rollpack_capture_stripped_bytes_total"));
}

// A ragged field's lists as int64 values and offsets, whatever its dtypes.
std::pair<std::vector<int64_t>, std::vector<int64_t>> Lists(const v1::RaggedArray& field) {
  auto decode = [](const v1::NDArray& a) {
    std::vector<int64_t> out;
    const std::string& d = a.data();
    const size_t width = a.dtype() == v1::UINT16 ? 2 : a.dtype() == v1::INT64 ? 8 : 4;
    for (size_t i = 0; i + width <= d.size(); i += width) {
      int64_t v = 0;
      if (width == 2) {
        uint16_t x;
        std::memcpy(&x, d.data() + i, 2);
        v = x;
      } else if (width == 4) {
        int32_t x;
        std::memcpy(&x, d.data() + i, 4);
        v = x;
      } else {
        std::memcpy(&v, d.data() + i, 8);
      }
      out.push_back(v);
    }
    return out;
  };
  return {decode(field.values()), decode(field.offsets())};
}

// The one sample of a step's single micro-batch carries `expected` as its
// sampling_mask: its rows' lists come first (padding rows after: empty).
void ExpectDeliveredMask(const std::vector<v1::Microbatch>& mbs, const v1::RaggedArray& expected) {
  ASSERT_EQ(mbs.size(), 1u);
  ASSERT_EQ(mbs[0].ragged_token_fields().count("sampling_mask"), 1u)
      << "the micro-batch has no sampling_mask";
  const auto [values, offsets] = Lists(mbs[0].ragged_token_fields().at("sampling_mask"));
  const auto [want_values, want_offsets] = Lists(expected);
  ASSERT_GE(offsets.size(), want_offsets.size());
  EXPECT_EQ(std::vector<int64_t>(offsets.begin(), offsets.begin() + want_offsets.size()),
            want_offsets);
  ASSERT_GE(values.size(), want_values.size());
  EXPECT_EQ(std::vector<int64_t>(values.begin(), values.begin() + want_values.size()),
            want_values);
  EXPECT_EQ(offsets.back(), static_cast<int64_t>(want_values.size())) << "padding rows: empty";
}

TEST_F(CaptureTest, AVllmSamplingMaskIsStoredAsTheRaggedFieldAndLeftInTheAnswer) {
  Start("vllm", {"--return-sampling-mask"});
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  const std::string request = R"({"model": "standin-moe", "token_ids": [5, 6, 7, 8],
      "sampling_params": {"max_tokens": 5, "top_k": 4}})";
  httplib::Result direct = PostToEngine("/inference/v1/generate", request);
  httplib::Result captured = Post("/inference/v1/generate", request,
                                  {{"X-Rollpack-Sample-Id", "masked-1"}});
  ASSERT_TRUE(direct && captured);
  ASSERT_EQ(captured->status, 200) << captured->body;
  EXPECT_EQ(captured->get_header_value("X-Rollpack-Capture"), "stored");
  // The mask stays in the answer (no field of rollpackd's asked for it).
  EXPECT_THAT(captured->body, HasSubstr("\"sampling_mask\":[["));
  EXPECT_EQ(Canonical(captured->body), Canonical(direct->body, kVllmRouting));

  v1::Sample expected = StandinChoiceSample("masked-1", prompt, 0, 5);
  const std::vector<int32_t> generated = StandinGenerated(prompt, 0, 5).first;
  (*expected.mutable_ragged_token_fields())["sampling_mask"] =
      StandinSamplingMask(prompt.size(), generated);
  std::vector<v1::Microbatch> mbs;
  ExpectStored({expected}, &mbs);
  ExpectDeliveredMask(mbs, expected.ragged_token_fields().at("sampling_mask"));
}

TEST_F(CaptureTest, AnSglangSamplingMaskTheRequestAskedForIsStoredSessionPiecesAppendingIt) {
  Start("sglang");
  // Turn 1, then turn 2 with a tool result: the sample's lists are empty on
  // every prompt token and the engine's on every generated one.
  std::vector<int32_t> prompt = {10, 11, 12};
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;
  std::vector<float> logprobs;
  std::vector<int64_t> offsets = {0};
  std::vector<int32_t> values;
  const int max_new[] = {3, 2};
  for (int turn = 0; turn < 2; ++turn) {
    if (turn == 1) prompt.push_back(77);
    const std::string request = absl::StrCat(
        R"({"input_ids": [)", absl::StrJoin(prompt, ","), R"(], "return_sampling_mask": true,)",
        R"( "sampling_params": {"top_k": 8, "max_new_tokens": )", max_new[turn], "}}");
    httplib::Headers headers = {{"X-Rollpack-Session", "masked-agent"}};
    if (turn == 1) headers.emplace("X-Rollpack-Final", "true");
    httplib::Result r = Post("/generate", request, headers);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("X-Rollpack-Capture"), "stored") << "turn " << turn;
    EXPECT_THAT(r->body, HasSubstr("output_token_sampling_mask"));
    EXPECT_EQ(Canonical(r->body), Canonical(PostToEngine("/generate", request)->body));

    auto [generated, generated_logprobs] = StandinGenerated(prompt, 0, max_new[turn]);
    offsets.resize(prompt.size() + 1, offsets.back());
    for (size_t j = 0; j < generated.size(); ++j) {
      const std::vector<int32_t> kept = StandinKept(generated[j], static_cast<int>(j));
      values.insert(values.end(), kept.begin(), kept.end());
      offsets.push_back(static_cast<int64_t>(values.size()));
    }
    loss_mask.resize(prompt.size(), 0);
    logprobs.resize(prompt.size(), 0.0f);
    tokens = prompt;
    tokens.insert(tokens.end(), generated.begin(), generated.end());
    loss_mask.insert(loss_mask.end(), generated.size(), 1);
    logprobs.insert(logprobs.end(), generated_logprobs.begin(), generated_logprobs.end());
    prompt = tokens;
  }
  v1::Sample expected = StandinSample("masked-agent", tokens, loss_mask, logprobs, kSglangModel);
  v1::RaggedArray& mask = (*expected.mutable_ragged_token_fields())["sampling_mask"];
  mask.mutable_values()->set_dtype(v1::INT32);
  mask.mutable_values()->add_shape(static_cast<int64_t>(values.size()));
  mask.mutable_values()->set_data(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  mask.mutable_offsets()->set_dtype(v1::INT64);
  mask.mutable_offsets()->add_shape(static_cast<int64_t>(offsets.size()));
  mask.mutable_offsets()->set_data(
      std::string(reinterpret_cast<const char*>(offsets.data()), offsets.size() * 8));
  std::vector<v1::Microbatch> mbs;
  ExpectStored({expected}, &mbs);
  ExpectDeliveredMask(mbs, mask);
}

TEST_F(CaptureTest, AStreamedVllmSamplingMaskIsGatheredFromItsEvents) {
  Start("vllm", {"--return-sampling-mask"});
  const std::string request = R"({"model": "standin-moe", "token_ids": [9, 8, 7],
      "sampling_params": {"max_tokens": 4, "top_k": 4}, "stream": true})";
  const std::string captured = Dechunk(
      RawExchange(capture_port_, "/inference/v1/generate", request, "X-Rollpack-Sample-Id: s"));
  EXPECT_THAT(captured, HasSubstr("\"sampling_mask\":[["));
  v1::Sample expected = StandinChoiceSample("s", {9, 8, 7}, 0, 4);
  (*expected.mutable_ragged_token_fields())["sampling_mask"] =
      StandinSamplingMask(3, StandinGenerated({9, 8, 7}, 0, 4).first);
  std::vector<v1::Microbatch> mbs;
  ExpectStored({expected}, &mbs);
  ExpectDeliveredMask(mbs, expected.ragged_token_fields().at("sampling_mask"));
}

// The value of `series` (name and labels as exposed) in a /metrics text.
double MetricValue(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::ConsumePrefix(&line, series + " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line, &value)) return value;
  }
  ADD_FAILURE() << series << " is not in the scrape";
  return -1;
}

// A captured stream's own time is what rollpackd held its final event for
// (its parse, strip and store), counted apart from answers read whole, and
// not the engine's 100 ms between events.
TEST_F(CaptureTest, AStreamsOwnTimeIsCountedApartFromWholeAnswers) {
  Start("vllm", {"--stream-interval-ms", "100"},
        {"--metrics-listen=127.0.0.1:0", "--metrics-port-file=" + dir_ + "/mport"});
  const std::string streamed = RawExchange(
      capture_port_, "/inference/v1/generate",
      R"({"model": "standin-moe", "token_ids": [4, 5, 6], "sampling_params": {"max_tokens": 4},
          "stream": true})");
  EXPECT_THAT(streamed, HasSubstr("X-Rollpack-Capture: stored\r\n"));
  httplib::Result whole =
      Post("/v1/completions", R"({"model": "standin-moe", "prompt": [4, 5, 6], "max_tokens": 4})");
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->get_header_value("X-Rollpack-Capture"), "stored");

  int metrics_port = 0;
  std::ifstream(dir_ + "/mport") >> metrics_port;
  httplib::Client scrape("127.0.0.1", metrics_port);
  httplib::Result metrics = scrape.Get("/metrics");
  ASSERT_TRUE(metrics);
  const std::string& m = metrics->body;
  EXPECT_EQ(MetricValue(m, "rollpack_capture_overhead_seconds_count{mode=\"stream\"}"), 1);
  EXPECT_EQ(MetricValue(m, "rollpack_capture_overhead_seconds_count{mode=\"body\"}"), 1);
  EXPECT_EQ(MetricValue(m, "rollpack_capture_upstream_seconds_count"), 2);
  // The stream's events came 100 ms apart (5 of them, [DONE] included).
  EXPECT_GE(MetricValue(m, "rollpack_capture_upstream_seconds_sum"), 0.3);
  const double stream_own =
      MetricValue(m, "rollpack_capture_overhead_seconds_sum{mode=\"stream\"}");
  EXPECT_GT(stream_own, 0);
  EXPECT_LT(stream_own, 0.25);
}

// Answers without a Content-Length are charged to --capture-record-memory
// as they arrive: six at once, each larger than the whole budget, all come
// whole and are stored (answers growing at once never wait on each other).
TEST_F(CaptureTest, ChunkedAnswersLargerThanTheRecordBudgetAreAllStored) {
  Start("vllm", {}, {"--capture-record-memory=1000"});
  constexpr int kRequests = 6;
  std::vector<std::string> outcomes(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([this, i, &outcomes] {
      httplib::Result r = Post(
          "/v1/completions",
          absl::StrCat(R"({"model": "standin-moe", "prompt": [1, 2, )", i,
                       R"(], "max_tokens": 24, "standin_chunked": 300})"),
          {{"X-Rollpack-Sample-Id", absl::StrCat("chunked-", i)}});
      if (!r) return;
      outcomes[i] = absl::StrCat(r->status, " ", r->get_header_value("X-Rollpack-Capture"));
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<v1::Sample> expected;
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(outcomes[i], "200 stored") << i;
    expected.push_back(StandinChoiceSample(absl::StrCat("chunked-", i), {1, 2, i}, 0, 24));
  }
  ExpectStored(expected);
  // Each as the engine answered it to the request as forwarded: larger
  // than the budget.
  httplib::Result engine_answer = PostToEngine(
      "/v1/completions", R"({"model": "standin-moe", "prompt": [1, 2, 0], "max_tokens": 24,
                             "return_token_ids": true, "logprobs": 0, "standin_chunked": 300})");
  ASSERT_TRUE(engine_answer);
  EXPECT_EQ(engine_answer->get_header_value("Transfer-Encoding"), "chunked");
  EXPECT_GT(engine_answer->body.size(), 1000u);
}

}  // namespace
}  // namespace rollpack
