// How rollpackd serves FetchMicrobatches (rollpackd --max-concurrent-streams,
// --max-streams-per-client, --stream-write-timeout, --stream-buffer-memory,
// --first-microbatch-priority).
#ifndef ROLLPACK_SERVER_DELIVERY_FETCH_OPTIONS_H_
#define ROLLPACK_SERVER_DELIVERY_FETCH_OPTIONS_H_

#include <cstdint>

#include "absl/time/time.h"

namespace rollpack {

struct FetchOptions {
  // FetchMicrobatches streams in flight at once (0 = no limit); past it a
  // new one gets RESOURCE_EXHAUSTED.
  int max_concurrent_streams = 0;
  // The same, per client host (0 = no limit): one client cannot take the
  // whole of max_concurrent_streams.
  int max_streams_per_client = 0;
  // A micro-batch the client has not taken this long after it was written
  // (its receive window full: the client stopped reading) ends the stream,
  // which releases the micro-batch's memory; the trainer resumes. Zero or
  // infinite = never.
  absl::Duration write_timeout = absl::Minutes(10);
  // Bytes of micro-batches encoded for all streams and not yet taken by the
  // transport (server/delivery/send_budget.h); 0 = no bound. It must exceed
  // every rank's prefetch: ranks that wait on each other (TP/PP
  // collectives) while some hold the budget with full prefetch queues would
  // stall until the write timeout ended the holders. kStreamBufferAuto (the
  // default) is the store's --max-memory: what ranks prefetch is a part of
  // the samples held, so it never waits there, while streams whose clients
  // stopped reading hold at most that much besides the samples.
  static constexpr int64_t kStreamBufferAuto = -1;
  int64_t stream_buffer_bytes = kStreamBufferAuto;
  // Hold prefetch writes while other streams' first micro-batches are in
  // flight (server/delivery/first_delivery_gate.h).
  bool first_microbatch_priority = true;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_DELIVERY_FETCH_OPTIONS_H_
