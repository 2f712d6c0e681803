// A captured stream (shared/spec/capture.md sections 3.1 and 4): vLLM's
// /inference/v1/generate and SGLang's /generate with "stream": true send
// server-sent events whose last one per choice carries the routing. This
// splits the body into events as it arrives, gives each to the client as
// the engine would have sent it to the request as asked (minus the
// routing), and hands over each choice once its final event is in: vLLM's
// events carry the new tokens and logprobs only, gathered here; SGLang's
// carry everything so far. No networking: the proxy feeds it bytes.
#ifndef ROLLPACK_SERVER_CAPTURE_STREAM_CAPTURE_H_
#define ROLLPACK_SERVER_CAPTURE_STREAM_CAPTURE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/capture/engine_exchange.h"

namespace rollpack {

struct StreamEvent {
  // The event as the client gets it, with its blank line.
  std::string text;
  // A choice's final event: the choice (its routing a view into `storage`),
  // its index among the request's choices, and the response's id.
  std::optional<EngineChoice> final_choice;
  int64_t index = 0;
  std::string response_id;
  // A final event that could not be read: why (the choice is not stored).
  absl::Status problem;
  int64_t stripped_bytes = 0;  // routing payload bytes taken out
  std::string storage;  // the event's JSON, padded for simdjson
};

class StreamCapture {
 public:
  // `endpoint` is kVllmGenerate or kSglangGenerate; `request` as forwarded.
  StreamCapture(CaptureEndpoint endpoint, ForwardedRequest request, bool keep_routing);

  // Appends `bytes` of the body; returns the events now complete, in order.
  std::vector<StreamEvent> Feed(absl::string_view bytes);
  // What is left once the body ended (an event without its blank line):
  // passed on as it is.
  std::string TakeRest();

 private:
  StreamEvent Event(absl::string_view raw);
  void ReadData(absl::string_view data, StreamEvent& event);

  const CaptureEndpoint endpoint_;
  const ForwardedRequest request_;
  const bool keep_routing_;
  std::string pending_;
  // vLLM: each choice's tokens, logprobs and sampling mask so far, by index.
  struct Gathered {
    std::vector<int32_t> ids;
    std::vector<float> logprobs;
    SamplingMaskLists sampling_mask;  // each event's lists, when it has them
  };
  std::map<int64_t, Gathered> gathered_;
  // SGLang: item 0's id, the base id B of every item's sample.
  std::string first_item_id_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_STREAM_CAPTURE_H_
