// Whether this server takes new samples now: OK, or the status every new
// sample is refused with (a cluster member drained for maintenance answers
// UNAVAILABLE naming itself: docs/cluster.md, "Maintenance: draining a
// member"). PutSamples asks it for each message, the capture port for each
// generation request it would capture. Empty: always OK.
#ifndef ROLLPACK_SERVER_INGEST_INTAKE_CHECK_H_
#define ROLLPACK_SERVER_INGEST_INTAKE_CHECK_H_

#include <functional>

#include "absl/status/status.h"

namespace rollpack {

using IntakeCheck = std::function<absl::Status()>;

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_INTAKE_CHECK_H_
