// The server side of Rollouts.PutSamples. Request messages arrive as raw
// bytes; up to IngestOptions::messages_in_flight of one stream are parsed and
// validated at once on a worker pool, and committed in the order they were
// sent, each all or nothing. The first refused message ends the stream;
// earlier ones stay committed, later ones are dropped.
//
// Why: gRPC reads one stream's messages one after another, so with a single
// producer the server parsed (copied out of gRPC's slices into fresh memory)
// and validated one message at a time and a single producer got a fraction
// of the link on a host with cores to spare (docs/performance.md).
#ifndef ROLLPACK_SERVER_INGEST_PUT_SAMPLES_REACTOR_H_
#define ROLLPACK_SERVER_INGEST_PUT_SAMPLES_REACTOR_H_

#include <memory>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "server/ingest/commit_sequencer.h"
#include "server/ingest/ingest_options.h"
#include "server/ingest/intake_check.h"
#include "base/worker_pool.h"
#include "server/ops/server_metrics.h"
#include "server/store/sample_store.h"

namespace rollpack {

// The reactor of one PutSamples stream; it deletes itself when the stream is
// done. Its messages are committed through `sequencer`, as stream `stripe`
// of the call (server/ingest/commit_sequencer.h; a call of one stream has a
// sequencer of its own). `workers` may be null (then
// ingest.messages_in_flight is taken as 1); `metrics` too. `intake` is
// asked before each message commits (a refusal ends the stream as a
// refused message does).
grpc::ServerReadReactor<grpc::ByteBuffer>* NewPutSamplesReactor(SampleStore* store,
                                                                ServerMetrics* metrics,
                                                                WorkerPool* workers,
                                                                const IngestOptions& ingest,
                                                                std::shared_ptr<CommitSequencer> sequencer,
                                                                int stripe,
                                                                grpc::ByteBuffer* response,
                                                                IntakeCheck intake = {});

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_PUT_SAMPLES_REACTOR_H_
