// How rollpackd serves FetchMicrobatches (rollpackd --max-concurrent-streams,
// --first-microbatch-priority).
#ifndef ROLLPACK_SERVER_DELIVERY_FETCH_OPTIONS_H_
#define ROLLPACK_SERVER_DELIVERY_FETCH_OPTIONS_H_

namespace rollpack {

struct FetchOptions {
  // FetchMicrobatches streams in flight at once (0 = no limit); past it a
  // new one gets RESOURCE_EXHAUSTED.
  int max_concurrent_streams = 0;
  // Hold prefetch writes while other streams' first micro-batches are in
  // flight (server/delivery/first_delivery_gate.h).
  bool first_microbatch_priority = true;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_DELIVERY_FETCH_OPTIONS_H_
