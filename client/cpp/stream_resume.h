// Riding out a server restart on a trainer stream (docs/trainer.md, "Riding
// out restarts"): when the stream's next attempt is made, and where a
// consumer resumes once the stream gave up.
//
// Every error that ends a TrainerStream or a DeviceStream carries the index
// of the first micro-batch the consumer did not receive: in its message
// ("...; resume from micro-batch 7") for people, and as a payload under
// kResumeFromTypeUrl for programs (ResumeFrom). Opening the same rank again
// with start_index = that index continues byte-identically.
#ifndef ROLLPACK_CLIENT_CPP_STREAM_RESUME_H_
#define ROLLPACK_CLIENT_CPP_STREAM_RESUME_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

// Payload type URL of the resume index. The value is the index in decimal
// ASCII (e.g. "7"), so that it reads the same from any language without a
// message definition.
inline constexpr char kResumeFromTypeUrl[] = "type.rollpack.dev/rollpack.ResumeFrom";

// `status` with "; resume from micro-batch <index>" after its message and
// the payload set (replacing an earlier one); code and other payloads kept.
// OK stays OK.
absl::Status WithResumeFrom(const absl::Status& status, int64_t index);

// The index a failed stream's status carries; nullopt when it carries none
// (or a value that is not a non-negative decimal number).
std::optional<int64_t> ResumeFrom(const absl::Status& status);

// Delays between resume attempts: exponential from `initial`, doubling per
// failed attempt, each at most `max`.
struct ResumeBackoff {
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(5);
};

// The delay before resume attempt `attempt` (0 = the first after a failure;
// counted since the last micro-batch received): min(max, initial * 2^attempt)
// times a factor in [0.75, 1] drawn from (seed, attempt). Jitter spreads the
// ranks of a job that all lost the same server, so they do not reconnect in
// lockstep; drawing it from a seed keeps one stream's schedule reproducible,
// and never exceeding the cap keeps the worst case what the options say.
absl::Duration ResumeDelay(const ResumeBackoff& backoff, int attempt, uint64_t seed);

// A seed that differs between the ranks of a step and is the same in every
// run (FNV-1a of the step id and the coordinates; absl::Hash is salted per
// process).
uint64_t ResumeSeed(const std::string& step_id, const v1::RankCoords& rank);

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_STREAM_RESUME_H_
