// How rollpackd serves PutSamples (rollpackd --ingest-messages-in-flight,
// --ingest-threads, --max-samples-per-message).
#ifndef ROLLPACK_SERVER_INGEST_INGEST_OPTIONS_H_
#define ROLLPACK_SERVER_INGEST_INGEST_OPTIONS_H_

namespace rollpack {

struct IngestOptions {
  // Messages of one PutSamples stream being parsed, validated or waiting to
  // commit at once; each holds up to a message's bytes. 1 = one at a time on
  // gRPC's thread, no worker pool.
  int messages_in_flight = 4;
  // Threads of the worker pool (0 = one per core, at most 8).
  int threads = 0;
  // Samples one PutSamplesRequest may carry (0 = no limit). Bytes are bounded
  // by --max-message-bytes; this bounds the work one message makes, which
  // grows with its sample count (validation, one stored object per sample,
  // the commit that holds the call's sequencer), not with its bytes.
  int max_samples_per_message = 65536;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_INGEST_OPTIONS_H_
