#include "server/capture/stream_capture.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/capture/sampling_mask_json.h"
#include "simdjson.h"

namespace rollpack {
namespace {

// Where the first event in `text` ends (after its blank line), or npos.
size_t EventEnd(absl::string_view text) {
  const size_t lf = text.find("\n\n");
  const size_t crlf = text.find("\r\n\r\n");
  if (lf == absl::string_view::npos && crlf == absl::string_view::npos) {
    return absl::string_view::npos;
  }
  if (crlf != absl::string_view::npos && (lf == absl::string_view::npos || crlf < lf)) {
    return crlf + 4;
  }
  return lf + 2;
}

// A choice's place and whether it finished, from the event as the client
// gets it (small: its routing is gone). vLLM: choices[0]; SGLang: the
// item's "index" (0 when absent) and meta_info.
struct EventChoice {
  bool present = false;
  int64_t index = 0;
  bool finished = false;
  std::string item_id;
};

EventChoice ReadEventChoice(CaptureEndpoint endpoint, const std::string& client_body) {
  EventChoice out;
  simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (parser.parse(client_body).get(root) != simdjson::SUCCESS) return out;
  if (endpoint == CaptureEndpoint::kVllmGenerate) {
    simdjson::dom::array choices;
    if (root["choices"].get(choices) != simdjson::SUCCESS || choices.size() == 0) return out;
    simdjson::dom::element choice = choices.at(0).value_unsafe();
    out.present = true;
    if (choice["index"].get(out.index) != simdjson::SUCCESS) out.index = 0;
    simdjson::dom::element finish;
    out.finished = choice["finish_reason"].get(finish) == simdjson::SUCCESS && !finish.is_null();
    return out;
  }
  out.present = true;
  if (root["index"].get(out.index) != simdjson::SUCCESS) out.index = 0;
  simdjson::dom::element finish;
  out.finished =
      root.at_pointer("/meta_info/finish_reason").get(finish) == simdjson::SUCCESS &&
      !finish.is_null();
  std::string_view id;
  if (root.at_pointer("/meta_info/id").get(id) == simdjson::SUCCESS) out.item_id = std::string(id);
  return out;
}

// An SGLang event's top-level "index" (its item), read without parsing the
// event: nothing before it holds a quote-delimited "index" key (routing is
// base64, ids and logprobs are numbers). 0 when absent; an index past
// int64 (the engine's bytes) is read as the largest.
int64_t ItemIndex(absl::string_view json) {
  const size_t at = json.rfind("\"index\":");
  if (at == absl::string_view::npos) return 0;
  int64_t index = 0;
  for (size_t i = at + 8; i < json.size(); ++i) {
    if (json[i] == ' ') continue;
    if (json[i] < '0' || json[i] > '9') break;
    const int digit = json[i] - '0';
    if (index > (std::numeric_limits<int64_t>::max() - digit) / 10) {
      return std::numeric_limits<int64_t>::max();
    }
    index = index * 10 + digit;
  }
  return index;
}

}  // namespace

StreamCapture::StreamCapture(CaptureEndpoint endpoint, ForwardedRequest request,
                             bool keep_routing)
    : endpoint_(endpoint), request_(std::move(request)), keep_routing_(keep_routing) {}

std::vector<StreamEvent> StreamCapture::Feed(absl::string_view bytes) {
  pending_.append(bytes.data(), bytes.size());
  std::vector<StreamEvent> events;
  size_t consumed = 0;
  for (;;) {
    const absl::string_view rest = absl::string_view(pending_).substr(consumed);
    const size_t end = EventEnd(rest);
    if (end == absl::string_view::npos) break;
    events.push_back(Event(rest.substr(0, end)));
    consumed += end;
  }
  pending_.erase(0, consumed);
  return events;
}

std::string StreamCapture::TakeRest() { return std::exchange(pending_, std::string()); }

StreamEvent StreamCapture::Event(absl::string_view raw) {
  StreamEvent event;
  event.text = std::string(raw);
  // Only an event of data lines alone is read; comments, named events and
  // the final [DONE] pass as they are.
  std::string data;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(absl::StripSuffix(raw, "\n"), '\n')) {
    line = absl::StripSuffix(line, "\r");
    if (line.empty()) continue;
    if (!absl::ConsumePrefix(&line, "data:")) return event;
    absl::ConsumePrefix(&line, " ");
    if (!first) data += '\n';
    data.append(line.data(), line.size());
    first = false;
  }
  if (first || data == "[DONE]") return event;
  ReadData(data, event);
  return event;
}

void StreamCapture::ReadData(absl::string_view data, StreamEvent& event) {
  event.storage.reserve(data.size() + simdjson::SIMDJSON_PADDING);
  event.storage.assign(data.data(), data.size());
  event.storage.append(simdjson::SIMDJSON_PADDING, '\0');
  const absl::string_view json(event.storage.data(), data.size());
  // An SGLang item of a batch answers prompt index / n: the response reader
  // takes an item's prompt from a request of that prompt alone.
  const int64_t per_prompt =
      std::max<int64_t>(1, request_.choices_asked / std::max<int64_t>(1, request_.batch_size));
  ForwardedRequest item_request;
  const ForwardedRequest* request = &request_;
  if (endpoint_ == CaptureEndpoint::kSglangGenerate && request_.request_prompt_ids.size() > 1) {
    item_request = request_;
    item_request.request_prompt_ids = {
        request_.request_prompt_ids[std::min<size_t>(ItemIndex(json) / per_prompt,
                                                     request_.request_prompt_ids.size() - 1)]};
    item_request.batch_size = 1;
    item_request.choices_asked = 1;
    request = &item_request;
  }
  absl::StatusOr<EngineResponse> response =
      ParseEngineResponse(endpoint_, *request, json, keep_routing_);
  if (!response.ok()) {
    // Not the endpoint's event (an error the engine streamed, say): it is
    // passed on as sent, and nothing of it is stored.
    event.problem = absl::Status(response.status().code(),
                                 absl::StrCat("a streamed event: ", response.status().message()));
    return;
  }
  event.text = absl::StrCat("data: ", response->client_body, "\n\n");
  event.stripped_bytes = response->stripped_bytes;
  const EventChoice place = ReadEventChoice(endpoint_, response->client_body);
  if (!place.present || response->choices.empty()) return;
  EngineChoice& choice = response->choices[0];
  event.index = place.index;
  if (endpoint_ == CaptureEndpoint::kVllmGenerate) {
    // Each event carries the tokens since the last one.
    Gathered& gathered = gathered_[place.index];
    gathered.ids.insert(gathered.ids.end(), choice.generated_ids.begin(),
                        choice.generated_ids.end());
    gathered.logprobs.insert(gathered.logprobs.end(), choice.logprobs.begin(),
                             choice.logprobs.end());
    AppendSamplingMask(choice.sampling_mask, gathered.sampling_mask);
    if (!place.finished) return;
    choice.generated_ids = std::move(gathered.ids);
    choice.logprobs = gathered.logprobs.size() == choice.generated_ids.size()
                          ? std::move(gathered.logprobs)
                          : std::vector<float>();
    // Lists that do not cover the tokens are refused where the sample is made.
    choice.sampling_mask = std::move(gathered.sampling_mask);
    gathered_.erase(place.index);
    event.response_id = response->response_id;
  } else {
    if (place.index == 0 && first_item_id_.empty()) first_item_id_ = place.item_id;
    if (!place.finished) return;
    event.response_id = first_item_id_.empty() ? place.item_id : first_item_id_;
  }
  event.final_choice = std::move(choice);
}

}  // namespace rollpack
