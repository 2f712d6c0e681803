// The client address of each connection the HTTP/2 guard hands to gRPC
// (server/ops/h2_guard.h). gRPC names such a connection's peer "fd:N" (the
// socket it was given), which says nothing to an operator and would put every
// client in one --max-streams-per-client slot: code that reads a call's peer
// goes through CallPeer() instead of ServerContext::peer().
#ifndef ROLLPACK_SERVER_OPS_GUARDED_PEERS_H_
#define ROLLPACK_SERVER_OPS_GUARDED_PEERS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace rollpack {

// Records that the socket `fd` handed to gRPC carries the connection of
// `address` (gRPC's form, "ipv4:10.0.0.7:51234"). Called before the socket
// is handed over; a later socket with the same number replaces the entry,
// since the number is only reused once gRPC closed the first.
void RecordGuardedPeer(int fd, std::string address);

// `grpc_peer` as gRPC reports it, or for a guarded connection ("fd:N") the
// client address recorded for it ("fd:N" still when none was).
std::string CallPeer(absl::string_view grpc_peer);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_GUARDED_PEERS_H_
