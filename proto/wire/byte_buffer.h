// Protobuf messages to and from grpc::ByteBuffer, for the services and
// clients that handle raw bytes (served raw for speed, or hand-encoded):
// the one place that uses gRPC's protobuf buffer adapters.
#ifndef ROLLPACK_PROTO_WIRE_BYTE_BUFFER_H_
#define ROLLPACK_PROTO_WIRE_BYTE_BUFFER_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace rollpack::wire {

// Parses `bytes` into `message`, reading gRPC's slices in place.
// INVALID_ARGUMENT "<what> does not parse" when they are not a `message`.
absl::Status ParseFromByteBuffer(const grpc::ByteBuffer& bytes, absl::string_view what,
                                 google::protobuf::Message* message);

// The message's bytes in one buffer gRPC can send.
grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::Message& message);

}  // namespace rollpack::wire

#endif  // ROLLPACK_PROTO_WIRE_BYTE_BUFFER_H_
