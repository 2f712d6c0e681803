// The schedulers a step can be planned with, and the one table of what is
// said about each (its names on the command line, in JSON and in prose).
// Every branch on a SchedulerKind is a `switch` without `default`, so that
// -Wswitch names each place a new kind must be handled; the facts that are
// only data live in kSchedulerKinds. Pure C++: the wire's enum
// (rollpack.v1.SchedulerKind) is converted in server/store/convert.h.
#ifndef ROLLPACK_SCHEDULER_SCHEDULER_KIND_H_
#define ROLLPACK_SCHEDULER_SCHEDULER_KIND_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace rollpack {

enum class SchedulerKind {
  // DP-balanced packing; every micro-batch runs on CP groups of size cp.
  kStaticCp,
  // Hybrid DPxCP: each micro-batch splits the dp*cp ranks into power-of-two
  // CP groups sized to its sequences (layout.md section 8).
  kDynamicCp,
};

struct SchedulerKindTraits {
  SchedulerKind kind;
  // `rollpack plan --scheduler`, the plan's JSON and the CLI's reports.
  absl::string_view name;
  // The shorter spelling --scheduler also accepts.
  absl::string_view alias;
  // In prose, such as the caption of the plan's picture.
  absl::string_view title;
};

// In enum order: kSchedulerKinds[i].kind == SchedulerKind(i).
inline constexpr SchedulerKindTraits kSchedulerKinds[] = {
    {SchedulerKind::kStaticCp, "static_cp", "static", "static CP"},
    {SchedulerKind::kDynamicCp, "dynamic_cp", "dynamic", "dynamic CP"},
};

const SchedulerKindTraits& TraitsOf(SchedulerKind kind);

// The kind whose name or alias is `name`; nullopt for any other string.
std::optional<SchedulerKind> SchedulerKindFromName(absl::string_view name);

// "static_cp or dynamic_cp": every name, for an error that wants one.
std::string SchedulerKindNames();

// "static_cp (or static) or dynamic_cp (or dynamic)": what --scheduler takes.
std::string SchedulerKindSpellings();

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_SCHEDULER_KIND_H_
