// How DeviceStream::Open delivers one rank's stream (docs/trainer.md). Its
// own header because every delivery path (host, CUDA staging, TP leader)
// reads it, and none of them may depend on device_stream.h, which opens them.
#ifndef ROLLPACK_CLIENT_TRAINER_DEVICE_STREAM_OPTIONS_H_
#define ROLLPACK_CLIENT_TRAINER_DEVICE_STREAM_OPTIONS_H_

#include <string>

#include "absl/time/time.h"
#include "client/cpp/connect_failure.h"
#include "client/cpp/delivery_mode.h"

namespace rollpack {

struct DeviceStreamOptions {
  // CUDA device ordinal, or -1 for host arrays.
  int device = -1;
  // Micro-batches read ahead from the network (TrainerStream) and, on a
  // device, staged (copied + unpacked) ahead of the consumer.
  int prefetch = 2;
  bool all_fields = false;
  int start_index = 0;
  // How long the network side keeps resuming a broken stream (UNAVAILABLE,
  // transport errors), from the first failure with no micro-batch received
  // since; InfiniteDuration() = until the stream is destroyed. And an
  // additional cap on failed attempts in a row: < 0 = none, 0 = never
  // resume. TrainerStreamOptions has the details. Whatever ends a stream,
  // its error carries the index to resume from (ResumeFrom(),
  // client/cpp/stream_resume.h).
  absl::Duration resume_timeout = absl::Seconds(60);
  int max_resumes = -1;
  // Errors retrying cannot fix end the stream at once; an address that does
  // not resolve or refuses connections, after connect_grace while this
  // process never reached `target` (TrainerStreamOptions has the details).
  absl::Duration connect_grace = kDefaultConnectGrace;
  std::string target;
  bool tls = false;
  // Unpack replay_experts into each batch's replay_ids. Off: replay_ids is
  // absent, and neither its device memory nor the unpack kernel is spent
  // per micro-batch, for callers that write targets themselves into a
  // static buffer (StaticReplayTargets, docs/trainer.md).
  bool replay_ids = true;
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
  // Direct pulls from the cluster members holding the samples, the proxied
  // stream, or direct when the server serves it (client/cpp/delivery_mode.h;
  // TP-leader mode: the leader's streams).
  Delivery delivery = Delivery::kAuto;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_TRAINER_DEVICE_STREAM_OPTIONS_H_
