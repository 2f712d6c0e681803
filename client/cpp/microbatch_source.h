// The seam between receiving one rank's micro-batches and using them, stated
// as a rule: the device paths (client/trainer: the host path, one rank's
// CUDA staging, the TP leader) read "the next received micro-batch" through
// this interface and never build the network side themselves; they are
// handed an opener. TrainerStream is the implementation that reads
// rollpackd's stream; a test, or another transport, stands in for it.
#ifndef ROLLPACK_CLIENT_CPP_MICROBATCH_SOURCE_H_
#define ROLLPACK_CLIENT_CPP_MICROBATCH_SOURCE_H_

#include <functional>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "client/cpp/received_microbatch.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

class MicrobatchSource {
 public:
  virtual ~MicrobatchSource() = default;

  // The next micro-batch, its arrays still in the received buffers;
  // std::nullopt after the last one; or the error that ended the source,
  // carrying the index to resume from (stream_resume.h). Blocks until one
  // of those is there.
  virtual absl::StatusOr<std::optional<ReceivedMicrobatch>> NextReceived() = 0;

  // Ends the source: a blocked or later NextReceived returns CANCELLED (or
  // what was already received). Safe from any thread.
  virtual void Cancel() = 0;

  // NextReceived as a message (its arrays copied out of the buffers).
  absl::StatusOr<std::optional<v1::Microbatch>> Next();
};

// Opens the source of `rank`'s micro-batches (a TP leader opens one per rank
// of its group).
using MicrobatchSourceOpener =
    std::function<absl::StatusOr<std::unique_ptr<MicrobatchSource>>(const v1::RankCoords& rank)>;

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_MICROBATCH_SOURCE_H_
