// Trainer-side delivery of one rank's micro-batches as ready-to-use arrays
// (docs/trainer.md).
//
// DeviceStream reads the rank's stream (a MicrobatchSource: TrainerStream,
// read ahead on its own thread) and, for a CUDA device, stages every micro-batch on a second
// thread (cuda_staging.h): its arrays are copied into a pinned host buffer,
// copied to the device on the stream's own CUDA stream, and the replay ids
// are unpacked there by the unpack kernel into [layers, rows, K] int64/int32
// (layer l = RouterReplay target of local MoE layer l). Next() hands out a
// staged batch while the following ones are already being fetched and
// copied. For device -1 (CPU, and every build without CUDA) the arrays point
// into the received message (no copy) and the ids are unpacked by the CPU
// reference.
//
// TP-leader mode (tp_leader_size > 1, CUDA + NCCL only, tp_leader.h): only
// TP rank 0 of a (dp, cp, pp) group talks to rollpackd and distributes over
// NCCL; the communicator is agreed on through rollpackd's Rendezvous service
// and kept for the group's next step (tp_communicator.h). NCCL is loaded at
// run time (nccl_loader.h), so building needs no NCCL.
#ifndef ROLLPACK_CLIENT_TRAINER_DEVICE_STREAM_H_
#define ROLLPACK_CLIENT_TRAINER_DEVICE_STREAM_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/cpp/microbatch_source.h"
#include "client/trainer/array_ref.h"
#include "client/trainer/device_batch.h"
#include "client/trainer/device_stream_options.h"
#include "client/trainer/rendezvous.h"
#include "grpcpp/channel.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

namespace trainer_internal {
class BatchSource;  // batch_source.h: one per delivery path
}  // namespace trainer_internal

class DeviceStream {
 public:
  // `rank` is this process's coordinates. In TP-leader mode every rank of
  // the TP group constructs one with the same options; only rank.tp() == 0
  // uses `channel` for data (all use it for the NCCL id rendezvous).
  static absl::StatusOr<std::unique_ptr<DeviceStream>> Open(
      std::shared_ptr<grpc::Channel> channel, const std::string& step_id,
      const v1::RankCoords& rank, const DeviceStreamOptions& options);
  // The same with the micro-batches read from `sources` (one opened per rank
  // read: the TP leader opens its group's) instead of rollpackd's streams;
  // `channel` then serves only the TP group's rendezvous (may be null
  // outside TP-leader mode). Open is this with a TrainerStream per rank.
  static absl::StatusOr<std::unique_ptr<DeviceStream>> OpenFrom(
      MicrobatchSourceOpener sources, std::shared_ptr<grpc::Channel> channel,
      const std::string& step_id, const v1::RankCoords& rank, const DeviceStreamOptions& options);
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;

  // The next micro-batch (nullptr after the last one) or the error that
  // ended the stream. `consumer_stream` (a cudaStream_t as void*, nullptr =
  // legacy default stream) is made to wait for the batch's copies and
  // unpack; the batch's memory is released after the work queued on it.
  // An error carries the index to resume from (ResumeFrom(),
  // client/cpp/stream_resume.h): the first micro-batch not handed out.
  absl::StatusOr<std::shared_ptr<DeviceBatch>> Next(void* consumer_stream = nullptr);


 private:
  DeviceStream(std::unique_ptr<trainer_internal::BatchSource> source, int start_index);
  std::unique_ptr<trainer_internal::BatchSource> source_;
  // The first micro-batch not handed out yet, for errors that do not say
  // where to resume (a TP follower's, a staging failure).
  int next_index_;
};

// Whether this build has CUDA support (ROLLPACK_WITH_CUDA).
bool DeviceStreamHasCuda();

// Releases the NCCL communicators that TP-leader streams kept for later
// steps (DeviceStreamOptions::reuse_tp_communicator), e.g. at shutdown;
// streams open at the time keep theirs. Without it they live until the
// process exits. No-op without CUDA.
void CloseTpCommunicators();

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_TRAINER_DEVICE_STREAM_H_
