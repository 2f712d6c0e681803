// The capture port's parsers of what the network sends (shared/spec/
// capture.md): a client's generation request (ForwardRequest), the engine's
// answer (ParseEngineResponse), its server-sent events (StreamCapture), the
// X-Rollpack-* headers and the session finish (capture_headers.h), and a
// choice made into a sample (CapturedSample). Input: byte 0 picks the
// endpoint (the six CaptureEndpoint values), byte 1 the mode (request,
// response, stream, headers, captured sample), byte 2 flags (bit 0
// keep_routing, bits 1-2 one of four models, bit 3 a session turn, bits 4-7
// the start offset asked), byte 3 how the stream is cut into reads; then the
// request, a NUL, and the response. A request that ForwardRequest refuses is
// replaced by "{}". Oracle: nothing crashes; refusals are INVALID_ARGUMENT
// (NOT_FOUND for a session finish to another target) with a message; a
// forwarded request forwards again unchanged; a parsed response's client
// body is valid JSON where the engine's was, its routing views lie inside
// the body, and keep_routing changes the client's body only; a stream gives
// the same events however it is cut, a final choice's routing lies in its
// event; base64's AVX2 and scalar decoders agree; every choice becomes a
// sample or a clean refusal, and a sample ValidateSample accepts or refuses
// with INVALID_ARGUMENT; a streamed final choice goes through
// CaptureRecorder::RecordStreamed into a store.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_common.h"
#include "server/capture/base64.h"
#include "server/capture/capture_headers.h"
#include "server/capture/capture_recorder.h"
#include "server/capture/captured_sample.h"
#include "server/capture/engine_exchange.h"
#include "server/capture/stream_capture.h"
#include "server/ingest/sample_validation.h"
#include "server/store/sample_store.h"
#include "simdjson.h"

using namespace rollpack;

namespace {

enum Mode { kRequest, kResponse, kStream, kHeaders, kSample, kModes };

constexpr CaptureEndpoint kEndpoints[] = {
    CaptureEndpoint::kVllmCompletions, CaptureEndpoint::kVllmChat,
    CaptureEndpoint::kVllmGenerate,    CaptureEndpoint::kSglangGenerate,
    CaptureEndpoint::kSglangChat,      CaptureEndpoint::kSglangCompletions,
};

Engine EngineOf(CaptureEndpoint endpoint) {
  return endpoint == CaptureEndpoint::kVllmCompletions || endpoint == CaptureEndpoint::kVllmChat ||
                 endpoint == CaptureEndpoint::kVllmGenerate
             ? Engine::kVllm
             : Engine::kSglang;
}

// 0: the stand-in engine's model (4 MoE layers, E=8, K=2); 1: E=300 (uint16
// ids) with dense layers; 2: dense layers and one routed MTP layer; 3: dense.
ModelSpec MakeModel(int which) {
  ModelSpec m;
  m.name = "fuzz";
  m.num_layers = 4;
  if (which == 0) {
    m.num_experts = 8;
    m.topk = 2;
  } else if (which == 1) {
    m.num_experts = 300;
    m.topk = 2;
    m.moe_layers = {1, 3};
  } else if (which == 2) {
    m.num_layers = 3;
    m.num_experts = 8;
    m.topk = 2;
    m.moe_layers = {0, 2};
    m.num_mtp_layers = 1;
    m.mtp_routing = true;
  }
  return m;
}

// Whether `text` is JSON (simdjson's DOM parser validates all of it, UTF-8
// included; the on-demand parser only what it reads).
bool ValidJson(absl::string_view text) {
  static simdjson::dom::parser* parser = new simdjson::dom::parser();
  simdjson::padded_string padded(text.data(), text.size());
  simdjson::dom::element root;
  return parser->parse(padded).get(root) == simdjson::SUCCESS;
}

// An empty view (no routing) may point anywhere.
bool Inside(absl::string_view part, absl::string_view whole) {
  return part.empty() ||
         (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(!status.ok());
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  FUZZ_CHECK(!status.message().empty());
}

bool SameChoice(const EngineChoice& a, const EngineChoice& b) {
  return a.prompt_ids == b.prompt_ids && a.generated_ids == b.generated_ids &&
         a.logprobs.size() == b.logprobs.size() &&
         (a.logprobs.empty() || std::memcmp(a.logprobs.data(), b.logprobs.data(),
                                            a.logprobs.size() * sizeof(float)) == 0) &&
         a.routing_base64.data() == b.routing_base64.data() &&
         a.routing_base64.size() == b.routing_base64.size() && a.routing_dtype == b.routing_dtype &&
         a.engine_id == b.engine_id && a.unusable == b.unusable;
}

// `choice` as a sample: a clean refusal, or a sample ValidateSample accepts
// or refuses with INVALID_ARGUMENT.
void CheckSample(Engine engine, const EngineChoice& choice, const ModelSpec& model,
                 int64_t start_offset, const CapturedIdentity& identity) {
  absl::StatusOr<v1::Sample> sample = CapturedSample(engine, choice, model, start_offset, identity);
  if (!sample.ok()) {
    FUZZ_CHECK(sample.status().code() == absl::StatusCode::kInvalidArgument ||
               sample.status().code() == absl::StatusCode::kFailedPrecondition);
    FUZZ_CHECK(!sample.status().message().empty());
    return;
  }
  FUZZ_CHECK(choice.unusable.ok());
  const int64_t total =
      static_cast<int64_t>(choice.prompt_ids.size() + choice.generated_ids.size());
  FUZZ_CHECK(sample->sample_id() == identity.sample_id);
  FUZZ_CHECK(sample->tokens().shape_size() == 1);
  FUZZ_CHECK(sample->tokens().shape(0) == total - identity.stored_tokens);
  FUZZ_CHECK(sample->routed_experts().shape_size() == 3);
  FUZZ_CHECK(sample->routed_experts_row_offset() >= 0);
  FUZZ_CHECK(sample->routed_experts_row_offset() + sample->routed_experts().shape(0) <= total);
  absl::StatusOr<StoredSample> stored = ValidateSample(*sample, model);
  if (!stored.ok()) {
    CheckRefusal(stored.status());
    return;
  }
  FUZZ_CHECK(stored->sample_id == identity.sample_id);
  FUZZ_CHECK(stored->num_tokens() == total - identity.stored_tokens);
}

CapturedIdentity Identity(const ForwardedRequest& request, size_t index, size_t count,
                          bool session) {
  CapturedIdentity identity;
  identity.sample_id = count == 1 ? "fuzz" : absl::StrCat("fuzz#", index);
  if (count > 1 && request.batch_size == 1) {
    identity.group_id = "fuzz";
    identity.group_size = static_cast<int32_t>(count);
  }
  identity.policy_version = 3;
  identity.scalars = {{"reward", 0.5}};
  if (session) {
    identity.partial = true;
    identity.piece = 1;
    identity.stored_tokens = request.start_offset;
  }
  return identity;
}

// The client's request as forwarded; a refused one is checked and "{}"
// forwarded instead.
ForwardedRequest Forward(CaptureEndpoint endpoint, absl::string_view body, int64_t start) {
  absl::StatusOr<ForwardedRequest> out = ForwardRequest(endpoint, body, start);
  if (out.ok()) return *std::move(out);
  CheckRefusal(out.status());
  out = ForwardRequest(endpoint, "{}", start);
  FUZZ_CHECK(out.ok());
  return *std::move(out);
}

void FuzzRequest(CaptureEndpoint endpoint, absl::string_view body, int64_t start) {
  absl::StatusOr<ForwardedRequest> out = ForwardRequest(endpoint, body, start);
  if (!out.ok()) {
    CheckRefusal(out.status());
    return;
  }
  FUZZ_CHECK(out->choices_asked >= 1 && out->batch_size >= 1 && out->start_offset >= 0);
  FUZZ_CHECK(out->request_prompt_ids.empty() ||
             static_cast<int64_t>(out->request_prompt_ids.size()) == out->batch_size);
  if (ValidJson(body)) FUZZ_CHECK(ValidJson(out->body));
  // Everything is there now: forwarding again adds nothing and reads the same.
  absl::StatusOr<ForwardedRequest> again = ForwardRequest(endpoint, out->body, start);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->body == out->body);
  FUZZ_CHECK(again->added.empty());
  FUZZ_CHECK(again->streaming == out->streaming);
  FUZZ_CHECK(again->choices_asked == out->choices_asked);
  FUZZ_CHECK(again->batch_size == out->batch_size);
  FUZZ_CHECK(again->request_prompt_ids == out->request_prompt_ids);
  FUZZ_CHECK(again->start_offset == out->start_offset);
}

void FuzzResponse(CaptureEndpoint endpoint, const ForwardedRequest& request,
                  absl::string_view body_bytes, bool keep_routing, const ModelSpec& model,
                  bool session) {
  // The proxy's buffer: the body, then simdjson's padding.
  std::string storage(body_bytes);
  storage.append(simdjson::SIMDJSON_PADDING, '\0');
  const absl::string_view body(storage.data(), body_bytes.size());
  absl::StatusOr<EngineResponse> response =
      ParseEngineResponse(endpoint, request, body, keep_routing);
  if (!response.ok()) {
    CheckRefusal(response.status());
    return;
  }
  if (ValidJson(body)) FUZZ_CHECK(ValidJson(response->client_body));
  FUZZ_CHECK(response->stripped_bytes >= 0 &&
             response->stripped_bytes <= static_cast<int64_t>(body.size()));
  if (keep_routing && request.added.empty()) FUZZ_CHECK(response->client_body == body);
  for (const EngineChoice& choice : response->choices) {
    FUZZ_CHECK(Inside(choice.routing_base64, body));
    FUZZ_CHECK(choice.unusable.ok() || !choice.unusable.message().empty());
  }
  // keep_routing changes the client's body only.
  absl::StatusOr<EngineResponse> other =
      ParseEngineResponse(endpoint, request, body, !keep_routing);
  FUZZ_CHECK(other.ok());
  FUZZ_CHECK(other->response_id == response->response_id);
  FUZZ_CHECK(other->choices.size() == response->choices.size());
  for (size_t i = 0; i < response->choices.size(); ++i) {
    FUZZ_CHECK(SameChoice(other->choices[i], response->choices[i]));
  }
  const size_t count = response->choices.size();
  for (size_t i = 0; i < count; ++i) {
    CheckSample(EngineOf(endpoint), response->choices[i], model, request.start_offset,
                Identity(request, i, count, session));
  }
}

// What a stream's events say, to compare two cuts of one stream.
std::string Describe(const std::vector<StreamEvent>& events, const std::string& rest) {
  std::string out;
  for (const StreamEvent& e : events) {
    absl::StrAppend(&out, e.text.size(), ":", e.text, "|", e.final_choice.has_value(), e.index, "|",
                    e.response_id, "|", e.problem.ToString(), "|", e.stripped_bytes, "\n");
    if (e.final_choice.has_value()) {
      const EngineChoice& c = *e.final_choice;
      absl::StrAppend(&out, c.prompt_ids.size(), ",", c.generated_ids.size(), ",",
                      c.logprobs.size(), ",", c.routing_base64, ",", c.routing_dtype, ",",
                      c.engine_id, ",", c.unusable.ToString(), "\n");
    }
  }
  absl::StrAppend(&out, "rest:", rest);
  return out;
}

void FuzzStream(CaptureEndpoint endpoint, const ForwardedRequest& request, absl::string_view body,
                bool keep_routing, const ModelSpec& model, bool session, uint8_t cuts) {
  // Reads of 1 byte, up to 7, up to 64 or up to 4096, cut by a small PRNG.
  static constexpr size_t kMaxRead[] = {1, 7, 64, 4096};
  const size_t max_read = kMaxRead[cuts & 3];
  uint32_t state = 0x9e3779b9u ^ (uint32_t{cuts} * 0x85ebca6bu);
  StreamCapture cut(endpoint, request, keep_routing);
  std::vector<StreamEvent> events;
  for (size_t at = 0; at < body.size();) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    const size_t n = std::min(body.size() - at, 1 + state % max_read);
    for (StreamEvent& e : cut.Feed(body.substr(at, n))) events.push_back(std::move(e));
    at += n;
  }
  const std::string rest = cut.TakeRest();
  StreamCapture whole(endpoint, request, keep_routing);
  std::vector<StreamEvent> at_once = whole.Feed(body);
  FUZZ_CHECK(Describe(events, rest) == Describe(at_once, whole.TakeRest()));

  std::unique_ptr<SampleStore> store;
  std::unique_ptr<CaptureRecorder> recorder;
  CapturedRequest captured{endpoint, CaptureHeaders(), request, nullptr};
  for (const StreamEvent& e : events) {
    FUZZ_CHECK(!e.text.empty());
    FUZZ_CHECK(e.stripped_bytes >= 0);
    if (!e.problem.ok()) {
      FUZZ_CHECK(!e.final_choice.has_value());
      CheckRefusal(e.problem);
      continue;
    }
    if (!e.final_choice.has_value()) continue;
    const EngineChoice& choice = *e.final_choice;
    FUZZ_CHECK(e.storage.size() >= simdjson::SIMDJSON_PADDING);
    FUZZ_CHECK(
        Inside(choice.routing_base64,
               absl::string_view(e.storage.data(), e.storage.size() - simdjson::SIMDJSON_PADDING)));
    CheckSample(EngineOf(endpoint), choice, model, request.start_offset,
                Identity(request, 0, 1, session));
    // What the proxy does with it (response_relay.cc).
    if (store == nullptr) {
      store = std::make_unique<SampleStore>(int64_t{1} << 30);
      FUZZ_CHECK(store->RegisterModel("pool", model).ok());
      recorder = std::make_unique<CaptureRecorder>(store.get(), nullptr, EngineOf(endpoint), "pool",
                                                   keep_routing);
    }
    CaptureOutcome outcome = recorder->RecordStreamed(captured, choice, e.index, e.response_id);
    FUZZ_CHECK(outcome.samples_stored >= 0 && outcome.samples_stored <= 1);
  }
}

// The request part as header lines "Name: value" after a first line
// "METHOD TARGET"; the response part is the finish body.
void FuzzHeaders(absl::string_view head, absl::string_view body) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  absl::string_view method, target;
  std::vector<HeaderField> fields;
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::string_view line = lines[i];
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (i == 0) {
      const size_t space = line.find(' ');
      method = line.substr(0, space);
      if (space != absl::string_view::npos) target = line.substr(space + 1);
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    fields.push_back({line.substr(0, colon), line.substr(colon + 1)});
    (void)IsCaptureHeader(fields.back().first);
  }
  for (Engine engine : {Engine::kVllm, Engine::kSglang}) {
    (void)CapturedEndpoint(engine, method, target);
  }
  CaptureHeaders headers;
  absl::StatusOr<CaptureHeaders> parsed = ParseCaptureHeaders(fields);
  if (parsed.ok()) {
    headers = *parsed;
    FUZZ_CHECK(!headers.pool.has_value() || !headers.pool->empty());
    FUZZ_CHECK(!headers.sample_id.has_value() || !headers.sample_id->empty());
    FUZZ_CHECK(!headers.group_id.has_value() || !headers.group_id->empty());
    FUZZ_CHECK(!headers.session.has_value() || !headers.session->empty());
    FUZZ_CHECK(!headers.group_size.has_value() || *headers.group_size >= 0);
    if (headers.scalars.has_value()) {
      for (const auto& [name, value] : *headers.scalars) FUZZ_CHECK(std::isfinite(value));
    }
  } else {
    CheckRefusal(parsed.status());
  }
  absl::StatusOr<std::map<std::string, double>> scalars = ParseScalarsJson(body, "fuzz");
  if (scalars.ok()) {
    for (const auto& [name, value] : *scalars) FUZZ_CHECK(std::isfinite(value));
  } else {
    CheckRefusal(scalars.status());
  }
  absl::StatusOr<SessionFinishRequest> finish =
      ParseSessionFinish(method, target, body, headers, "default");
  if (finish.ok()) {
    FUZZ_CHECK(!finish->session.empty());
    FUZZ_CHECK(finish->session.find('/') == std::string::npos);
    FUZZ_CHECK(!finish->pool.empty());
    if (finish->scalars.has_value()) {
      for (const auto& [name, value] : *finish->scalars) FUZZ_CHECK(std::isfinite(value));
    }
  } else if (finish.status().code() != absl::StatusCode::kNotFound) {
    CheckRefusal(finish.status());
  }
}

// A choice built from the request part's bytes, its routing the response
// part (base64-encoded here unless `raw_base64`).
void FuzzSample(CaptureEndpoint endpoint, absl::string_view spec, absl::string_view routing,
                bool raw_base64, const ModelSpec& model, int64_t start, bool session) {
  FuzzedDataProvider in(reinterpret_cast<const uint8_t*>(spec.data()), spec.size());
  EngineChoice choice;
  const int prompt = in.ConsumeIntegralInRange(0, 40);
  for (int i = 0; i < prompt; ++i) {
    choice.prompt_ids.push_back(in.ConsumeIntegralInRange<int32_t>(0, INT32_MAX));
  }
  const int generated = in.ConsumeIntegralInRange(0, 40);
  for (int i = 0; i < generated; ++i) {
    choice.generated_ids.push_back(in.ConsumeIntegralInRange<int32_t>(0, INT32_MAX));
  }
  const int logprobs = in.ConsumeIntegralInRange(0, 2);  // none, one per token, one short
  if (logprobs > 0) {
    const int count = generated - (logprobs == 2 ? 1 : 0);
    for (int i = 0; i < count; ++i) choice.logprobs.push_back(in.ConsumeFloatingPoint<float>());
  }
  static const char* const kDtypes[] = {"",      "int32",  "uint8",  "torch.int16", "np.uint16",
                                        "int64", "uint32", "uint64", "int8",        "float32"};
  choice.routing_dtype = kDtypes[in.ConsumeIntegralInRange<size_t>(0, 9)];
  if (in.ConsumeBool()) choice.unusable = absl::FailedPreconditionError("fuzz: unusable");
  if (in.ConsumeBool()) start = in.ConsumeIntegral<int64_t>();
  CapturedIdentity identity;
  identity.sample_id = "fuzz";
  if (session) {
    identity.partial = true;
    identity.piece = 1;
    identity.stored_tokens = in.ConsumeIntegralInRange<int64_t>(0, 90);
  }
  const std::string encoded = raw_base64 ? std::string(routing) : absl::Base64Escape(routing);
  choice.routing_base64 = encoded;
  // The AVX2 decoder agrees with the scalar one exactly, refusals included.
  if (base64_internal::CpuHasAvx2()) {
    std::string scalar(Base64DecodedSize(encoded), '\0');
    std::string avx2(scalar.size(), '\0');
    absl::StatusOr<size_t> a = base64_internal::DecodeScalar(encoded, absl::MakeSpan(scalar));
    absl::StatusOr<size_t> b = base64_internal::DecodeAvx2(encoded, absl::MakeSpan(avx2));
    FUZZ_CHECK(a.status() == b.status());
    if (a.ok()) FUZZ_CHECK(*a == *b && scalar.compare(0, *a, avx2, 0, *b) == 0);
    if (a.ok() && !raw_base64) FUZZ_CHECK(absl::string_view(scalar).substr(0, *a) == routing);
  }
  CheckSample(EngineOf(endpoint), choice, model, start, identity);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const CaptureEndpoint endpoint = kEndpoints[data[0] % 6];
  const int mode = data[1] % kModes;
  const bool keep_routing = (data[2] & 1) != 0;
  const ModelSpec model = MakeModel((data[2] >> 1) & 3);
  const bool session = (data[2] & 8) != 0;
  const int64_t start = data[2] >> 4;
  const uint8_t cuts = data[3];
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 4, size - 4);
  const size_t nul = rest.find('\0');
  const absl::string_view request_part = rest.substr(0, nul);
  const absl::string_view response_part =
      nul == absl::string_view::npos ? absl::string_view() : rest.substr(nul + 1);
  switch (mode) {
    case kRequest:
      FuzzRequest(endpoint, request_part, start);
      break;
    case kResponse:
      FuzzResponse(endpoint, Forward(endpoint, request_part, start), response_part, keep_routing,
                   model, session);
      break;
    case kStream: {
      // The streamed endpoints: each engine's /generate.
      const CaptureEndpoint streamed = EngineOf(endpoint) == Engine::kVllm
                                           ? CaptureEndpoint::kVllmGenerate
                                           : CaptureEndpoint::kSglangGenerate;
      FuzzStream(streamed, Forward(streamed, request_part, start), response_part, keep_routing,
                 model, session, cuts);
      break;
    }
    case kHeaders:
      FuzzHeaders(request_part, response_part);
      break;
    case kSample:
      FuzzSample(endpoint, request_part, response_part, (cuts & 1) != 0, model, start, session);
      break;
  }
  return 0;
}
