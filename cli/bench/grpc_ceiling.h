// What gRPC itself carries on this machine, with nothing of rollpack in the
// way: client-streaming calls of ready-made messages into a server process
// (`rollpack bench grpc-sink`) that drops them, and server-streaming calls
// out of it. An ingest or fetch figure close to these is limited by gRPC's
// transport, not by rollpack's parsing, store or encoding.
#ifndef ROLLPACK_CLI_BENCH_GRPC_CEILING_H_
#define ROLLPACK_CLI_BENCH_GRPC_CEILING_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace rollpack {

struct GrpcCeilingOptions {
  // Bytes of each message; the streams send `total_bytes` between them.
  int64_t message_bytes = int64_t{8} << 20;
  int64_t total_bytes = int64_t{2} << 30;
  // Concurrent calls, each on a connection of its own.
  int streams = 1;
};

// Aggregate GB/s (1e9 bytes per second) into the sink at `address`.
absl::StatusOr<double> MeasureGrpcCeilingGBps(const std::string& address,
                                              const GrpcCeilingOptions& options);

// The other direction, as a trainer's stream runs: server-streaming calls,
// the sink process writing one ready-made message after another (one write
// in flight) and this process reading each as raw bytes and dropping it.
// Aggregate GB/s out of the sink.
absl::StatusOr<double> MeasureGrpcSourceGBps(const std::string& address,
                                             const GrpcCeilingOptions& options);

// `rollpack bench grpc-sink --port-file PATH [--grpc-arg NAME=INT,...]`:
// serves the sink (and the source) on 127.0.0.1 (an ephemeral port,
// written to PATH) until SIGTERM or SIGINT.
int RunGrpcSinkCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_GRPC_CEILING_H_
