// Rollouts.ListSamples on one store (a single server, or a member's own
// share): the request checked, the page token, and the page as the wire
// says it. The cluster merges members' pages (server/cluster/pool_admin.h).
#ifndef ROLLPACK_SERVER_STORE_SAMPLE_PAGES_H_
#define ROLLPACK_SERVER_STORE_SAMPLE_PAGES_H_

#include <string>

#include "absl/status/statusor.h"
#include "rollpack/v1/rollouts.pb.h"
#include "server/store/sample_store.h"

namespace rollpack {

inline constexpr int32_t kDefaultSamplesPageSize = 100;
inline constexpr int32_t kMaxSamplesPageSize = 10000;

// The store's request of a ListSamplesRequest: INVALID_ARGUMENT naming
// page_size, page_token, state or group_id when it is not one ListSamples
// takes.
absl::StatusOr<SampleStore::SamplePageRequest> SamplePageRequestOf(
    const v1::ListSamplesRequest& request);

// The token of the page after the one that ended with `last_id`: opaque to
// clients (web-safe base64 of the id), checked when it comes back.
std::string SamplesPageToken(const std::string& last_id);

// A page of this store's samples, `member` set on each (cluster mode; ""
// on a single server), and the next page's token when there is one.
absl::StatusOr<v1::ListSamplesResponse> ListLocalSamples(SampleStore* store,
                                                         const v1::ListSamplesRequest& request,
                                                         const std::string& member);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_SAMPLE_PAGES_H_
