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
//
// Direct pulls (options.delivery, delivery_mode.h): the member dialled sends
// each micro-batch's header piece, the members it lists send their rows on
// streams of their own (each read on a thread of its own, PieceReader), and
// the reader assembles each micro-batch from them (AssembleMicrobatch)
// before queueing it: the consumer sees the same micro-batches either way.
#ifndef ROLLPACK_CLIENT_CPP_TRAINER_STREAM_H_
#define ROLLPACK_CLIENT_CPP_TRAINER_STREAM_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/connect_failure.h"
#include "client/cpp/delivery_mode.h"
#include "client/cpp/microbatch_source.h"
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
  // Errors retrying cannot fix end the stream at once, naming the cause
  // (connect_failure.h): a failed TLS handshake, refused credentials. An
  // address that does not resolve or refuses connections is tried for
  // connect_grace only while this process has never reached `target`
  // (a server that is starting); once it has, it is a restart, ridden out
  // for resume_timeout. InfiniteDuration() = the whole resume_timeout.
  absl::Duration connect_grace = kDefaultConnectGrace;
  // The address the channel dials ("host:port"), for the above and for the
  // error's text; "" = any address this process reached counts.
  std::string target;
  // Whether the channel uses TLS (the error's text; a plaintext channel
  // whose connections a server closes asks it whether it speaks TLS).
  bool tls = false;
  // An additional cap on failed attempts in a row (since the last
  // micro-batch received): < 0 = none, only resume_timeout counts (the
  // default); 0 = never resume. It was the only limit before
  // resume_timeout (5, without waits in between).
  int max_resumes = -1;
  // Sent as `authorization: Bearer <token>` when rollpackd runs with
  // --auth-tokens (the trainer role may fetch), on every stream (the
  // members' of direct pulls too).
  std::string auth_token;
  // Direct pulls from the members holding the samples, the proxied stream,
  // or the first when the server serves it (delivery_mode.h).
  Delivery delivery = Delivery::kAuto;
  // The channel to a cluster member a header piece names ("host:port"),
  // made once per address and kept for the stream's life. Unset: a
  // plaintext channel with MakeChannel's arguments (cluster members serve
  // plaintext only; docs/cluster.md).
  std::function<std::shared_ptr<grpc::Channel>(const std::string& address)> member_channel;
};

class PieceReader;

// The MicrobatchSource that reads rollpackd's stream of one rank.
class TrainerStream final : public MicrobatchSource {
 public:
  TrainerStream(std::shared_ptr<grpc::Channel> channel, std::string step_id,
                v1::RankCoords rank, TrainerStreamOptions options = {});
  // Cancels the stream and joins the reader.
  ~TrainerStream() override;
  TrainerStream(const TrainerStream&) = delete;
  TrainerStream& operator=(const TrainerStream&) = delete;

  // The next micro-batch, std::nullopt after the last one, or the error that
  // ended the stream, which carries the index to resume from (ResumeFrom():
  // the first micro-batch this stream did not hand out). Its arrays are
  // still in the received buffers: a consumer copies them straight to their
  // destination (DeviceStream's pinned staging), or takes a message (Next).
  absl::StatusOr<std::optional<ReceivedMicrobatch>> NextReceived() override;

  // Ends the stream: a blocked or later Next() returns CANCELLED (or what
  // was already queued). Safe from any thread.
  void Cancel() override;

  // Times the stream was resumed after a transport error.
  int resumes() const;

 private:
  // How one attempt (one opening of the stream's calls) ended.
  struct Attempt {
    // OK: the stream's end.
    absl::Status status;
    // Where the error came from, for the wait before the next attempt.
    std::shared_ptr<grpc::Channel> channel;
    // Pieces that do not fit together: retried as a transport error is, a
    // few times at the same micro-batch.
    bool protocol_error = false;
    // A member (the one dialled or another) does not serve FetchPieces (an
    // older rollpackd).
    bool no_direct = false;
    // A member the header piece lists could not be reached: kAuto goes on
    // proxied through the member dialled (it may reach what this rank
    // cannot: a trainer behind NAT or a Service address).
    bool member_unreachable = false;
  };

  void ReadLoop();
  Attempt ProxyAttempt(int* next_index, int* failures);
  Attempt DirectAttempt(int* next_index, int* failures);
  // Opens a FetchPieces stream that Cancel() reaches; nullptr once cancelled.
  std::unique_ptr<PieceReader> OpenPieces(const std::shared_ptr<grpc::Channel>& channel,
                                          bool header, int start_index);
  std::shared_ptr<grpc::Channel> MemberChannel(const std::string& address);
  // Queues a micro-batch once there is room; false when cancelled.
  bool Enqueue(ReceivedMicrobatch message);
  // Waits `delay` before the next attempt, or less when `channel`, not
  // ready at the failure, connects (the server is back). False when the
  // stream was cancelled meanwhile.
  bool WaitToResume(absl::Duration delay, const std::shared_ptr<grpc::Channel>& channel);

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
  // The piece streams of the current direct attempt, for Cancel().
  std::vector<PieceReader*> piece_readers_ ABSL_GUARDED_BY(mu_);
  // Reader thread only.
  std::map<std::string, std::shared_ptr<grpc::Channel>> member_channels_;
  std::thread reader_;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_TRAINER_STREAM_H_
