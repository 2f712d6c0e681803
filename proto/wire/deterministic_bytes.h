// Deterministic serialization (map fields sorted) for comparing messages
// byte for byte, or as a key: protobuf's default map order is not canonical.
#ifndef ROLLPACK_PROTO_WIRE_DETERMINISTIC_BYTES_H_
#define ROLLPACK_PROTO_WIRE_DETERMINISTIC_BYTES_H_

#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"

namespace rollpack {

inline std::string DeterministicBytes(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  message.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

}  // namespace rollpack

#endif  // ROLLPACK_PROTO_WIRE_DETERMINISTIC_BYTES_H_
