// Trainer-side delivery of one rank's micro-batches as ready-to-use arrays
// (docs/trainer.md).
//
// DeviceStream reads the rank's stream (TrainerStream, read ahead on its own
// thread) and, for a CUDA device, stages every micro-batch on a second
// thread: its arrays are copied into a pinned host buffer, copied to the
// device with cudaMemcpyAsync on the stream's own CUDA stream, and the replay
// ids are unpacked there by the unpack kernel into [layers, rows, K]
// int64/int32 (layer l = RouterReplay target of local MoE layer l). Next()
// hands out a staged batch while the following ones are already being
// fetched and copied. For device -1 (CPU, and every build without CUDA) the
// arrays point into the received message (no copy) and the ids are unpacked
// by the CPU reference.
//
// TP-leader mode (tp_leader_size > 1, CUDA + NCCL only): only TP rank 0 of a
// (dp, cp, pp) group talks to rollpackd; it fetches every TP rank's stream
// and distributes over NCCL: metadata and tokens / token fields broadcast,
// each rank's sequence-parallel replay rows + mask sent with grouped
// send/recv. The NCCL unique id goes through rollpackd's Rendezvous service;
// the communicator is kept for the group's next step (reuse_tp_communicator).
// NCCL is loaded at run time (dlopen), so building needs no NCCL.
#ifndef ROLLPACK_CLIENT_CPP_DEVICE_STREAM_H_
#define ROLLPACK_CLIENT_CPP_DEVICE_STREAM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

// A dense C-order array in host (device == -1) or CUDA device memory.
struct ArrayRef {
  void* data = nullptr;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  int64_t numel() const;
  int64_t nbytes() const;
};

int ElementSize(v1::DType dtype);

struct DeviceStreamOptions {
  // CUDA device ordinal, or -1 for host arrays.
  int device = -1;
  // Micro-batches read ahead from the network (TrainerStream) and, on a
  // device, staged (copied + unpacked) ahead of the consumer.
  int prefetch = 2;
  bool all_fields = false;
  int start_index = 0;
  // Unpacked replay ids as int32 instead of int64.
  bool ids_int32 = false;
  // Unpack writes -1 on rows with mask 0 instead of the filler ids.
  bool masked_fill_minus_one = false;
  // TP-leader mode: the TP group's size (the topology's tp). 0 or 1 = off.
  int tp_leader_size = 0;
  // Seconds TP ranks wait for the leader's NCCL id.
  int rendezvous_timeout_s = 300;
  // Part of the rendezvous key (with step, dp, cp, pp, start_index): give a
  // new one (e.g. the job id + attempt) when a group is opened again for the
  // same step, so no rank picks up the previous opening's id.
  std::string rendezvous_tag;
  // Sent as `authorization: Bearer <token>` on the stream and the
  // rendezvous calls when rollpackd runs with --auth-tokens (trainer role).
  // TLS is the channel's business (MakeChannel).
  std::string auth_token;
  // TP-leader mode: keep the group's NCCL communicator when the stream ends
  // cleanly and reuse it for the next step of the same group (same device,
  // dp, cp, pp, TP size and rank) when every rank of the group still holds
  // it; otherwise a new one is created. The environment variable
  // ROLLPACK_TP_COMM_REUSE=0 turns it off as well. Either way each step
  // does a small rendezvous through rollpackd, so ranks with different
  // settings still agree (they then create a new communicator every step).
  bool reuse_tp_communicator = true;
};

// One micro-batch. Metadata from the wire message (its big byte fields are
// released on a device), arrays on `device`. Device memory is freed when the
// batch is destroyed, stream-ordered after the consumer's stream given to
// Next(), so tensors viewing it stay valid while the batch is alive.
class DeviceBatch {
 public:
  ~DeviceBatch();
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  const v1::Microbatch& meta() const { return meta_; }
  int device() const { return device_; }
  const ArrayRef& tokens() const { return tokens_; }
  const ArrayRef& cu_seqlens() const { return cu_seqlens_; }
  const ArrayRef& cu_seqlens_padded() const { return cu_seqlens_padded_; }
  // [rows, layers, K] uint8 / uint16 as received.
  const ArrayRef& replay_experts() const { return replay_experts_; }
  const ArrayRef& replay_mask() const { return replay_mask_; }
  // [layers, rows, K] int64 (or int32): the unpacked RouterReplay targets.
  const ArrayRef& replay_ids() const { return replay_ids_; }
  const std::map<std::string, ArrayRef>& token_fields() const { return token_fields_; }

  // Filled by DeviceStream's implementations (device_stream.cc).
  DeviceBatch() = default;
  void* consumer_stream() const { return consumer_stream_; }

  // --- implementation state ---

  v1::Microbatch meta_;
  int device_ = -1;
  ArrayRef tokens_, cu_seqlens_, cu_seqlens_padded_, replay_experts_, replay_mask_, replay_ids_;
  std::map<std::string, ArrayRef> token_fields_;
  std::vector<int64_t> host_ids_;  // CPU path: unpacked ids
  // Device path: releases the memory after the work queued on the stream
  // given here (the consumer's).
  std::function<void(void*)> release_;
  void* consumer_stream_ = nullptr;
};

class DeviceStream {
 public:
  // `rank` is this process's coordinates. In TP-leader mode every rank of
  // the TP group constructs one with the same options; only rank.tp() == 0
  // uses `channel` for data (all use it for the NCCL id rendezvous).
  static absl::StatusOr<std::unique_ptr<DeviceStream>> Open(
      std::shared_ptr<grpc::Channel> channel, const std::string& step_id,
      const v1::RankCoords& rank, const DeviceStreamOptions& options);
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;

  // The next micro-batch (nullptr after the last one) or the error that
  // ended the stream. `consumer_stream` (a cudaStream_t as void*, nullptr =
  // legacy default stream) is made to wait for the batch's copies and
  // unpack; the batch's memory is released after the work queued on it.
  absl::StatusOr<std::shared_ptr<DeviceBatch>> Next(void* consumer_stream = nullptr);

  bool cuda_built() const;

  struct Impl;

 private:
  explicit DeviceStream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Whether this build has CUDA support (ROLLPACK_WITH_CUDA).
bool DeviceStreamHasCuda();

// Releases the NCCL communicators that TP-leader streams kept for later
// steps (DeviceStreamOptions::reuse_tp_communicator), e.g. at shutdown;
// streams open at the time keep theirs. Without it they live until the
// process exits. No-op without CUDA.
void CloseTpCommunicators();

// Rendezvous helpers (rendezvous.proto): post `value` under `key`, or wait
// up to `timeout` for it. A non-empty `auth_token` goes out as a bearer token.
absl::Status RendezvousPost(const std::shared_ptr<grpc::Channel>& channel, const std::string& key,
                            const std::string& value, const std::string& auth_token = "");
absl::StatusOr<std::string> RendezvousWait(const std::shared_ptr<grpc::Channel>& channel,
                                           const std::string& key, int timeout_s,
                                           const std::string& auth_token = "");

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_DEVICE_STREAM_H_
