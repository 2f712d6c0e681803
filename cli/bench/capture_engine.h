// The stand-in inference server of `rollpack bench capture`: a minimal
// HTTP/1.1 server (Boost.Asio, one thread, in the benchmark's process) that
// answers vLLM /v1/chat/completions requests with bodies computed once, so
// that the engine costs next to nothing beside what the capture port does
// with its answers. The bodies are vLLM's format (shared/spec/capture.md
// section 3.1: prompt_token_ids, token_ids, logprobs content and
// routed_experts as base64 of a .npy [rows, L, K]), valid for the pool's
// model, so that rollpackd stores every one.
#ifndef ROLLPACK_CLI_BENCH_CAPTURE_ENGINE_H_
#define ROLLPACK_CLI_BENCH_CAPTURE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace rollpack {

// One choice of a chat completion: P prompt tokens, G generated ones, and
// routing rows for positions [0, P + G - 1) over `layers` MoE layers, top
// `topk` of `experts` (uint8 ids for experts <= 256, else int16, as vLLM
// writes them).
struct ChoiceShape {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int layers = 48;
  int topk = 8;
  int experts = 128;
};

// vLLM's non-streaming /v1/chat/completions answer of one choice to a
// request that asked for token ids and logprobs (what rollpackd forwards),
// with routing capture on. `id` is the response's id.
std::string VllmChatBody(const ChoiceShape& shape, const std::string& id);

// A client's chat request: a user message of about `prompt_tokens` tokens
// of text (four bytes each) and max_tokens; with `stream`, "stream": true.
std::string ChatRequestBody(int64_t prompt_tokens, int64_t max_tokens, bool stream);

// Request headers the engine reads (forwarded by rollpackd like any other):
//   X-Bench-Body: I          answer with body I (given to Start)
//   X-Bench-Burst: NAME      hold the answer until the burst NAME is complete
//   X-Bench-Stream: N,US     answer with a server-sent-event stream of N
//                            chat.completion.chunk events US microseconds
//                            apart, then `data: [DONE]`; each event carries
//                            "bench_sent_ns": the steady clock (ns) at its
//                            write, which the client subtracts from its arrival
// A non-streaming generation request without "return_token_ids" (one that
// did not come through the capture port, nor as it forwards it) is refused
// 400 and counted.
class FakeEngine {
 public:
  static absl::StatusOr<std::unique_ptr<FakeEngine>> Start(std::vector<std::string> bodies);
  ~FakeEngine();

  int port() const;
  int64_t answered() const;  // bodies written in full
  int64_t refused() const;   // 400s: no capture fields, unknown body, malformed

  // Requests of burst `name` are held until `count` of them arrived (or
  // `timeout` passed: then `count` is not reached and they are answered
  // anyway); then `on_arrived` runs on the engine's thread, and the held
  // requests are answered evenly spread over `spread`, in arrival order.
  // Returns once armed.
  void ArmBurst(const std::string& name, int count, absl::Duration spread, absl::Duration timeout,
                std::function<void(int arrived)> on_arrived);

  class Impl;

 private:
  explicit FakeEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The steady clock in nanoseconds, as "bench_sent_ns" gives it.
int64_t SteadyNanos();

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_CAPTURE_ENGINE_H_
