// Client side of rollpackd's Rendezvous service (rendezvous.proto), through
// which the ranks of a TP group agree on their NCCL communicator. Public:
// trainers may use it to exchange their own small values the same way.
#ifndef ROLLPACK_CLIENT_TRAINER_RENDEZVOUS_H_
#define ROLLPACK_CLIENT_TRAINER_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/channel.h"

namespace rollpack {

// Post `value` under `key`, or wait up to `timeout_s` for it. A non-empty
// `auth_token` goes out as a bearer token.
absl::Status RendezvousPost(const std::shared_ptr<grpc::Channel>& channel, const std::string& key,
                            const std::string& value, const std::string& auth_token = "");
absl::StatusOr<std::string> RendezvousWait(const std::shared_ptr<grpc::Channel>& channel,
                                           const std::string& key, int timeout_s,
                                           const std::string& auth_token = "");

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_TRAINER_RENDEZVOUS_H_
