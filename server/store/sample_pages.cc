#include "server/store/sample_pages.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/store/names.h"

namespace rollpack {

absl::StatusOr<SampleStore::SamplePageRequest> SamplePageRequestOf(
    const v1::ListSamplesRequest& request) {
  RETURN_IF_ERROR(ValidateName("pool name", request.pool(), kMaxPoolNameBytes));
  SampleStore::SamplePageRequest out;
  if (request.page_size() < 0 || request.page_size() > kMaxSamplesPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("page_size ", request.page_size(),
                                                   " is not in 0..", kMaxSamplesPageSize, " (0: ",
                                                   kDefaultSamplesPageSize, ")"));
  }
  out.limit = request.page_size() == 0 ? kDefaultSamplesPageSize : request.page_size();
  if (!request.page_token().empty()) {
    std::string id;
    if (!absl::WebSafeBase64Unescape(request.page_token(), &id) ||
        !ValidateName("page_token", id, kMaxSampleIdBytes).ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page_token \"", request.page_token().substr(0, 64),
          "\" is not one ListSamples returned (pass next_page_token as it came)"));
    }
    out.after = std::move(id);
  }
  if (!v1::SampleState_IsValid(request.state())) {
    return absl::InvalidArgumentError(
        absl::StrCat("state ", request.state(), " is not a SampleState"));
  }
  out.state = request.state();
  if (!request.group_id().empty()) {
    RETURN_IF_ERROR(ValidateName("group_id", request.group_id(), kMaxSampleIdBytes));
    out.group_id = request.group_id();
  }
  return out;
}

std::string SamplesPageToken(const std::string& last_id) {
  return absl::WebSafeBase64Escape(last_id);
}

absl::StatusOr<v1::ListSamplesResponse> ListLocalSamples(SampleStore* store,
                                                         const v1::ListSamplesRequest& request,
                                                         const std::string& member) {
  ASSIGN_OR_RETURN(SampleStore::SamplePageRequest page_request, SamplePageRequestOf(request));
  ASSIGN_OR_RETURN(SampleStore::SamplePage page,
                   store->ListSamplePage(request.pool(), page_request));
  v1::ListSamplesResponse response;
  for (v1::SampleInfo& info : page.samples) {
    if (!member.empty()) info.set_member(member);
    *response.add_samples() = std::move(info);
  }
  if (page.more && response.samples_size() > 0) {
    response.set_next_page_token(
        SamplesPageToken(response.samples(response.samples_size() - 1).sample_id()));
  }
  return response;
}

}  // namespace rollpack
