// The project's one set of status macros (every fallible call returns
// absl::Status or absl::StatusOr): early return on error, assignment from a
// StatusOr, and annotation that adds context while keeping the code.
//
//   RETURN_IF_ERROR(ValidateTopologySizes(topology));
//   ASSIGN_OR_RETURN(Plan plan, ComputePlan(lengths, topology));
//   ASSIGN_OR_RETURN(auto layout, StepLayout::Create(plan, lengths, topology, model));
//   RETURN_IF_ERROR(Annotate(log->Sync(ticket), "durable log"));
#ifndef ROLLPACK_BASE_STATUS_MACROS_H_
#define ROLLPACK_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#if defined(RETURN_IF_ERROR) || defined(ASSIGN_OR_RETURN)
#error "another library defines RETURN_IF_ERROR or ASSIGN_OR_RETURN"
#endif

namespace rollpack {

// `status` with "context: " before its message and the same code; OK stays
// OK. Payloads are kept.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok() || context.empty()) return status;
  absl::Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

namespace status_macros_internal {

inline const absl::Status& AsStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& AsStatus(const T& status_or) {
  return status_or.status();
}

}  // namespace status_macros_internal
}  // namespace rollpack

// Evaluates `expr` (an absl::Status or absl::StatusOr) once and returns its
// status from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                 \
    if (auto rollpack_status_ = (expr); ABSL_PREDICT_FALSE(!rollpack_status_.ok())) {  \
      return ::rollpack::status_macros_internal::AsStatus(rollpack_status_);           \
    }                                                                                  \
  } while (false)

// `lhs` = the value of `rexpr` (an absl::StatusOr), or returns its status.
// `lhs` may declare a variable (`ASSIGN_OR_RETURN(auto x, F())`) or name an
// existing one. Not for use as the body of an unbraced if/else.
#define ASSIGN_OR_RETURN(lhs, rexpr)                                                 \
  ROLLPACK_ASSIGN_OR_RETURN_IMPL_(                                                   \
      ROLLPACK_STATUS_MACROS_CONCAT_(rollpack_status_or_, __LINE__), lhs, rexpr)

#define ROLLPACK_ASSIGN_OR_RETURN_IMPL_(status_or, lhs, rexpr) \
  auto status_or = (rexpr);                                    \
  if (ABSL_PREDICT_FALSE(!status_or.ok())) {                   \
    return std::move(status_or).status();                      \
  }                                                            \
  lhs = *std::move(status_or)

#define ROLLPACK_STATUS_MACROS_CONCAT_INNER_(x, y) x##y
#define ROLLPACK_STATUS_MACROS_CONCAT_(x, y) ROLLPACK_STATUS_MACROS_CONCAT_INNER_(x, y)

#endif  // ROLLPACK_BASE_STATUS_MACROS_H_
