#include "client/cpp/microbatch_source.h"

#include "base/status_macros.h"

namespace rollpack {

absl::StatusOr<std::optional<v1::Microbatch>> MicrobatchSource::Next() {
  ASSIGN_OR_RETURN(std::optional<ReceivedMicrobatch> next, NextReceived());
  if (!next.has_value()) return std::optional<v1::Microbatch>();
  return std::optional<v1::Microbatch>(next->ToMessage());
}

}  // namespace rollpack
