#include "proto/wire/byte_buffer.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace rollpack::wire {
namespace {

// gRPC's own default block size for serializing into a ByteBuffer.
constexpr int kWriterBlockBytes = 8192;

}  // namespace

absl::Status ParseFromByteBuffer(const grpc::ByteBuffer& bytes, absl::string_view what,
                                 google::protobuf::Message* message) {
  // ProtoBufferReader takes a mutable buffer but only reads it; the copy
  // shares the slices (reference counts), not the bytes.
  grpc::ByteBuffer shared(bytes);
  grpc::ProtoBufferReader reader(&shared);
  if (!reader.status().ok() || !message->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " does not parse"));
  }
  return absl::OkStatus();
}

grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::Message& message) {
  grpc::ByteBuffer out;
  const size_t size = message.ByteSizeLong();
  grpc::ProtoBufferWriter writer(&out, kWriterBlockBytes, static_cast<int>(size));
  message.SerializeToZeroCopyStream(&writer);
  return out;
}

}  // namespace rollpack::wire
