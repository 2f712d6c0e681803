// Hand-written framing of length-delimited protobuf fields, for the paths that
// write a message's bytes directly into a transport buffer instead of building
// the message and serializing it (server/delivery/microbatch_encoder.cc on fetch,
// client/cpp/put_samples_stream.cc on ingest). The bytes are exactly what
// protobuf's own serializer writes for the same field.
#ifndef ROLLPACK_PROTO_WIRE_WIRE_FORMAT_H_
#define ROLLPACK_PROTO_WIRE_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace rollpack::wire {

// Bytes of field `field_number` holding `payload` bytes: tag, length, payload.
inline size_t LengthDelimitedSize(int field_number, size_t payload) {
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
  return CodedOutputStream::VarintSize32(
             WireFormatLite::MakeTag(field_number, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) +
         CodedOutputStream::VarintSize64(payload) + payload;
}

// Writes the tag and length of such a field; returns where its payload goes.
inline uint8_t* WriteLengthDelimitedHeader(int field_number, size_t payload, uint8_t* out) {
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
  out = CodedOutputStream::WriteTagToArray(
      WireFormatLite::MakeTag(field_number, WireFormatLite::WIRETYPE_LENGTH_DELIMITED), out);
  return CodedOutputStream::WriteVarint64ToArray(payload, out);
}

}  // namespace rollpack::wire

#endif  // ROLLPACK_PROTO_WIRE_WIRE_FORMAT_H_
