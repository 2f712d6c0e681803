// Recovery: the durable log's records applied to an empty store.
#ifndef ROLLPACK_SERVER_STORE_LOG_REPLAY_H_
#define ROLLPACK_SERVER_STORE_LOG_REPLAY_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/store/durable_log.h"
#include "server/store/sample_store.h"

namespace rollpack {

// Replays `records` into an empty store through its public API. DATA_LOSS
// naming the record when a record does not decode or its mutation fails
// (the log and the code disagree).
absl::Status ReplayLog(absl::Span<const LogRecord> records, SampleStore* store);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_LOG_REPLAY_H_
