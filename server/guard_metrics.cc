#include "server/guard_metrics.h"

#include <utility>

namespace rollpack {

void AddGuardMetrics(metrics::ScrapeRegistry& registry,
                     std::shared_ptr<const H2GuardCounters> guard) {
  registry.AddCollectCallback(
      [guard = std::move(guard), open = &registry.AddGauge("rollpack_h2_guard_connections",
                                        "Client connections the HTTP/2 guard relays now "
                                        "(plaintext ports and TLS ports without client "
                                        "certificates; docs/operations.md, \"Hardening\")"),
       refused = &registry.AddCounter(
           "rollpack_h2_guard_refused_connections_total",
           "Connections closed at accept by the HTTP/2 guard: reason=\"cooling_down\" (the "
           "client host overdrew its stream-reset budget lately), \"per_client\" "
           "(--max-connections-per-client), \"total\" (--max-connections)"),
       closed = &registry.AddCounter(
           "rollpack_h2_guard_closed_connections_total",
           "Connections the HTTP/2 guard closed: reason=\"stream_resets\" (over the client "
           "host's --stream-reset-budget, HTTP/2 rapid reset), \"header_block\" (a "
           "CONTINUATION flood), \"unauthenticated\" (calls without a valid token sent more "
           "than 1 MiB of requests), \"not_http2\", \"tls_handshake\" (a TLS port's handshake "
           "failed or took over 10 s)"),
       resets = &registry.AddCounter(
           "rollpack_h2_guard_stream_resets_total",
           "RST_STREAM frames clients sent through the HTTP/2 guard"),
       buffered = &registry.AddGauge(
           "rollpack_h2_guard_client_buffer_bytes",
           "Bytes of buffers the HTTP/2 guard holds for clients' bytes in flight to gRPC, "
           "at most --transport-memory / 4 together"),
       waits = &registry.AddCounter(
           "rollpack_h2_guard_client_buffer_waits_total",
           "Times a client connection found the guard's client buffers all held and stopped "
           "reading until one came back")] {
        // Zeros without a guard (TLS, loopback): the series exist either way.
        static const H2GuardCounters kNone;
        const H2GuardCounters& c = guard != nullptr ? *guard : kNone;
        open->Add({}).Set(static_cast<double>(c.open.load()));
        auto catch_up = [](prometheus::Counter& counter, int64_t value) {
          counter.Increment(static_cast<double>(value) - counter.Value());
        };
        catch_up(refused->Add({{"reason", "cooling_down"}}), c.refused_cooling_down.load());
        catch_up(refused->Add({{"reason", "per_client"}}), c.refused_per_client.load());
        catch_up(refused->Add({{"reason", "total"}}), c.refused_total.load());
        catch_up(closed->Add({{"reason", "stream_resets"}}), c.closed_stream_resets.load());
        catch_up(closed->Add({{"reason", "header_block"}}), c.closed_header_block.load());
        catch_up(closed->Add({{"reason", "not_http2"}}), c.closed_not_http2.load());
        catch_up(closed->Add({{"reason", "tls_handshake"}}), c.closed_tls_handshake.load());
        catch_up(closed->Add({{"reason", "unauthenticated"}}), c.closed_unauthenticated.load());
        catch_up(resets->Add({}), c.streams_reset.load());
        buffered->Add({}).Set(static_cast<double>(c.client_buffer_bytes.load()));
        catch_up(waits->Add({}), c.client_buffer_waits.load());
      });
}

}  // namespace rollpack
