// The HTTP/2 guard's counters (server/ops/h2_guard_options.h) as metric
// families of rollpackd's /metrics (docs/operations.md, "Metrics").
#ifndef ROLLPACK_SERVER_GUARD_METRICS_H_
#define ROLLPACK_SERVER_GUARD_METRICS_H_

#include <memory>

#include "server/ops/h2_guard_options.h"
#include "server/ops/metrics/scrape_registry.h"

namespace rollpack {

// Declared on every server, `guard` null where no port is fronted (mutual
// TLS, loopback without tokens): the series read zero, so dashboards see the
// same series everywhere.
void AddGuardMetrics(metrics::ScrapeRegistry& registry,
                     std::shared_ptr<const H2GuardCounters> guard);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_GUARD_METRICS_H_
