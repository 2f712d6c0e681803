// One Trainer.FetchPieces stream (direct pulls, trainer.proto PieceRows) read
// on a thread of its own into a bounded queue: TrainerStream opens one per
// member holding pieces of a rank's micro-batches, so the pieces of every
// member arrive in parallel while it assembles them in order. Like
// TrainerStream's own reader, it keeps each message as gRPC received it
// (ReceivedMicrobatch) and copies nothing.
#ifndef ROLLPACK_CLIENT_CPP_PIECE_READER_H_
#define ROLLPACK_CLIENT_CPP_PIECE_READER_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/received_microbatch.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

class PieceReader {
 public:
  // Starts the call at once. `capacity` (>= 1): pieces held ahead of Next().
  // `auth_token` non-empty: sent as `authorization: Bearer <token>`.
  PieceReader(std::shared_ptr<grpc::Channel> channel, const v1::PieceRequest& request,
              const std::string& auth_token, int capacity);
  // Cancels the call and joins the thread.
  ~PieceReader();
  PieceReader(const PieceReader&) = delete;
  PieceReader& operator=(const PieceReader&) = delete;

  // The next piece (blocks), std::nullopt when the stream ended cleanly, or
  // how it failed: the call's status, or INTERNAL for a message that does
  // not parse (what the generated reader does). Queued pieces come first.
  absl::StatusOr<std::optional<ReceivedMicrobatch>> Next();

  // Ends the call; Next() then returns what was queued, then CANCELLED.
  // Safe from any thread.
  void Cancel();

 private:
  void Loop(std::shared_ptr<grpc::Channel> channel, v1::PieceRequest request);

  const int capacity_;
  grpc::ClientContext context_;
  absl::Mutex mu_;
  std::deque<ReceivedMicrobatch> queue_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_PIECE_READER_H_
