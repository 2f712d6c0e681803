// One trainer rank's stream of micro-batches, read ahead into a bounded queue
// on a background thread so the training loop never waits on the network for
// a micro-batch that could already be here. Resumes a broken stream at the
// next micro-batch (the server re-sends identical bytes), with exponential
// backoff for up to `resume_timeout`, so a rollpackd restarted with its
// --data-dir is ridden out; an error that ends the stream names the
// micro-batch to resume from (stream_resume.h).
//
// The reader thread only receives: it keeps gRPC's slices as they came off
// the socket and parses the small fields (ReceivedMicrobatch), so it is back
// to reading while the consumer copies the arrays out, once, where it needs
// them (NextReceived) or into a message (Next).
#ifndef ROLLPACK_CLIENT_CPP_TRAINER_STREAM_H_
#define ROLLPACK_CLIENT_CPP_TRAINER_STREAM_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/received_microbatch.h"
#include "client/cpp/stream_resume.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

struct TrainerStreamOptions {
  // Micro-batches held ahead of the consumer (>= 1).
  int prefetch = 2;
  bool all_fields = false;
  int start_index = 0;
  // How long the stream keeps resuming after UNAVAILABLE / transport
  // errors (INTERNAL, UNKNOWN), counted from the first failure with no
  // micro-batch received since; a micro-batch received starts the next
  // outage's budget afresh. Then the stream ends with the last error's code
  // (UNAVAILABLE when the server stayed unreachable). InfiniteDuration() =
  // never give up (until Cancel()).
  absl::Duration resume_timeout = absl::Seconds(60);
  // Waits between attempts (stream_resume.h).
  ResumeBackoff backoff;
  // An additional cap on failed attempts in a row (since the last
  // micro-batch received): < 0 = none, only resume_timeout counts (the
  // default); 0 = never resume. It was the only limit before
  // resume_timeout (5, without waits in between).
  int max_resumes = -1;
  // Sent as `authorization: Bearer <token>` when rollpackd runs with
  // --auth-tokens (the trainer role may fetch).
  std::string auth_token;
};

class TrainerStream {
 public:
  TrainerStream(std::shared_ptr<grpc::Channel> channel, std::string step_id,
                v1::RankCoords rank, TrainerStreamOptions options = {});
  // Cancels the stream and joins the reader.
  ~TrainerStream();
  TrainerStream(const TrainerStream&) = delete;
  TrainerStream& operator=(const TrainerStream&) = delete;

  // The next micro-batch, std::nullopt after the last one, or the error that
  // ended the stream, which carries the index to resume from (ResumeFrom():
  // the first micro-batch this stream did not hand out).
  absl::StatusOr<std::optional<v1::Microbatch>> Next();

  // The same, its arrays still in the received buffers: for a consumer that
  // copies them straight to their destination (DeviceStream's pinned
  // staging) instead of through a message.
  absl::StatusOr<std::optional<ReceivedMicrobatch>> NextReceived();

  // Ends the stream: a blocked or later Next() returns CANCELLED (or what
  // was already queued). Safe from any thread.
  void Cancel();

  // Times the stream was resumed after a transport error.
  int resumes() const;

 private:
  void ReadLoop();
  // Waits `delay` before the next attempt, or less when the channel, not
  // ready at the failure, connects (the server is back). False when the
  // stream was cancelled meanwhile.
  bool WaitToResume(absl::Duration delay);

  const std::string step_id_;
  const v1::RankCoords rank_;
  const TrainerStreamOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;

  mutable absl::Mutex mu_;
  std::deque<ReceivedMicrobatch> queue_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int resumes_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread reader_;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_TRAINER_STREAM_H_
