// The trainer's parser of received micro-batches (client/cpp/received_microbatch.h)
// on any bytes, cut into gRPC slices where the fuzzer says. Oracle: it accepts
// exactly what protobuf's parser accepts, gives the same message, and every
// array it locates (ragged token fields' too) lies inside the received bytes.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include "client/cpp/received_microbatch.h"
#include "fuzz/fuzz_common.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/wire/deterministic_bytes.h"

using namespace rollpack;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static google::protobuf::LogSilencer* quiet = new google::protobuf::LogSilencer();
  (void)quiet;
  FuzzedDataProvider in(data, size);
  const uint8_t pieces = in.ConsumeIntegralInRange<uint8_t>(1, 16);
  std::vector<size_t> cuts;
  for (int i = 1; i < pieces; ++i) cuts.push_back(in.ConsumeIntegral<uint16_t>());
  const std::string bytes = in.ConsumeRemainingBytesAsString();
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t cut : cuts) {
    cut = std::min(std::max(cut, at), bytes.size());
    slices.emplace_back(bytes.data() + at, cut - at);
    at = cut;
  }
  slices.emplace_back(bytes.data() + at, bytes.size() - at);
  const grpc::ByteBuffer buffer(slices.data(), slices.size());

  v1::Microbatch expected;
  const bool protobuf_ok = expected.ParseFromString(bytes);
  absl::StatusOr<ReceivedMicrobatch> received = ReceivedMicrobatch::Parse(buffer);
  FUZZ_CHECK(received.ok() == protobuf_ok);
  if (!received.ok()) return 0;
  FUZZ_CHECK(received->wire_bytes() == static_cast<int64_t>(bytes.size()));
  // Bytes, not MessageDifferencer: a NaN workload is the same value but
  // compares unequal.
  FUZZ_CHECK(DeterministicBytes(received->ToMessage()) == DeterministicBytes(expected));
  for (const char* name : {"tokens", "cu_seqlens", "cu_seqlens_padded", "replay_experts",
                           "replay_mask"}) {
    const int64_t n = received->data_size(name);
    FUZZ_CHECK(n <= received->wire_bytes());
    if (n > 0) {
      std::string out(static_cast<size_t>(n), '\0');
      received->CopyData(name, out.data());
    }
  }
  // Ragged token fields: both arrays located inside the bytes, and their
  // check (which reads the offsets in place) safe on anything that parses.
  for (const auto& [field, heads] : received->meta().ragged_token_fields()) {
    for (const std::string& name : {RaggedValuesName(field), RaggedOffsetsName(field)}) {
      const int64_t n = received->data_size(name);
      FUZZ_CHECK(n <= received->wire_bytes());
      if (n > 0) {
        std::string out(static_cast<size_t>(n), '\0');
        received->CopyData(name, out.data());
      }
    }
    absl::StatusOr<RaggedShape> shape = received->CheckRagged(field);
    FUZZ_CHECK(shape.ok() || shape.status().code() == absl::StatusCode::kDataLoss);
  }
  return 0;
}
