// The NCCL communicator of a TP group in TP-leader mode: agreed on through
// rollpackd's Rendezvous at every opening, reused across steps when every
// rank still holds the same idle one, released according to how the stream
// ended (docs/trainer.md). CUDA builds only.
#ifndef ROLLPACK_CLIENT_TRAINER_TP_COMMUNICATOR_H_
#define ROLLPACK_CLIENT_TRAINER_TP_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/trainer/device_stream_options.h"
#include "client/trainer/nccl_loader.h"
#include "grpcpp/channel.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack::trainer_internal {

struct TpGroupComm {
  ncclComm_t comm = nullptr;
  std::string generation;  // random, shared by the members of one communicator
  bool reused = false;     // came from an earlier step
  bool keep = false;       // reuse is on: keep it for the next step after a clean end
};

// This rank's communicator for the group of (dp, cp, pp) of `rank` on
// options.device, of options.tp_leader_size ranks: an idle one of an earlier
// step when every rank still holds it, else a new one. Blocks until every
// rank of the group has called it (options.rendezvous_timeout_s).
absl::StatusOr<TpGroupComm> ConnectTpGroup(const Nccl& nccl,
                                           const std::shared_ptr<grpc::Channel>& channel,
                                           const std::string& step_id, const v1::RankCoords& rank,
                                           const DeviceStreamOptions& options);

// Hands the communicator back at the end of a stream. `clean`: every rank
// ran the same NCCL calls up to the end marker and they completed, so it is
// idle and consistent on all ranks and may be kept or destroyed; otherwise
// the peers may be elsewhere in the protocol, so it is aborted.
void FinishTpGroup(const Nccl& nccl, const v1::RankCoords& rank,
                   const DeviceStreamOptions& options, TpGroupComm comm, bool clean);

// Aborts every kept idle communicator (CloseTpCommunicators).
void CloseIdleTpComms();

}  // namespace rollpack::trainer_internal

#endif  // ROLLPACK_CLIENT_TRAINER_TP_COMMUNICATOR_H_
