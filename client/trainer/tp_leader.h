// TP-leader mode (docs/trainer.md): only TP rank 0 of a (dp, cp, pp) group
// talks to rollpackd; it fetches every TP rank's stream and distributes over
// NCCL: metadata, tokens and token fields broadcast, each rank's
// sequence-parallel replay rows + mask sent with grouped send/recv, then
// every rank unpacks its own rows. CUDA builds only.
#ifndef ROLLPACK_CLIENT_TRAINER_TP_LEADER_H_
#define ROLLPACK_CLIENT_TRAINER_TP_LEADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/cpp/microbatch_source.h"
#include "client/trainer/batch_source.h"
#include "client/trainer/device_stream_options.h"
#include "grpcpp/channel.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack::trainer_internal {

// Every rank of the TP group opens one with the same options; returns once
// the group's communicator is set up (all ranks have opened). The leader
// reads its group's micro-batches from sources(rank of each TP rank);
// `channel` carries the communicator's rendezvous.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenTpLeaderSource(
    MicrobatchSourceOpener sources, std::shared_ptr<grpc::Channel> channel,
    const std::string& step_id, const v1::RankCoords& rank, const DeviceStreamOptions& options);

}  // namespace rollpack::trainer_internal

#endif  // ROLLPACK_CLIENT_TRAINER_TP_LEADER_H_
