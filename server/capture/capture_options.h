// The capture port's flags (shared/spec/capture.md section 1).
#ifndef ROLLPACK_SERVER_CAPTURE_CAPTURE_OPTIONS_H_
#define ROLLPACK_SERVER_CAPTURE_CAPTURE_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "server/capture/engine_exchange.h"

namespace rollpack {

struct CaptureOptions {
  std::string listen;    // --capture-listen HOST:PORT ("" = no capture port)
  std::string upstream;  // --capture-upstream http://HOST:PORT
  Engine engine = Engine::kVllm;  // --capture-engine
  std::string pool;               // --capture-pool: the default pool
  std::string model_file;         // --capture-model: registered on `pool` at start
  // --capture-pool-options: the PoolOptions (protobuf JSON) registered with
  // the model (required_scalars, group size, ...); needs model_file.
  std::string pool_options_file;
  bool keep_routing = false;      // --capture-keep-routing
  // --capture-timeout-seconds: the wait for the engine's response headers,
  // then between body reads; also a client's idle keep-alive connection.
  absl::Duration timeout = absl::Seconds(600);
  // --capture-max-body-bytes: larger requests are refused 413, larger
  // responses passed through uncaptured.
  int64_t max_body_bytes = int64_t{1} << 30;
  // --capture-record-memory: bytes of engine answers read whole and
  // waiting for the record workers, all connections together; past it a
  // connection waits before reading its next answer. 0 = no bound.
  int64_t record_memory_bytes = int64_t{256} << 20;
  // Event loops (each a thread holding any number of connections) and the
  // threads that parse, validate and store captured responses.
  int io_threads = 2;
  int record_threads = 2;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_CAPTURE_OPTIONS_H_
