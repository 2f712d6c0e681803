#include "scheduler/scheduler_kind.h"

#include <cstddef>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace rollpack {
namespace {

// Where `kind` sits in kSchedulerKinds. The switch, not a cast, so that a new
// kind without a row is a -Wswitch warning here rather than a read past the
// table.
constexpr size_t RowOf(SchedulerKind kind) {
  switch (kind) {
    case SchedulerKind::kStaticCp:
      return 0;
    case SchedulerKind::kDynamicCp:
      return 1;
  }
  return 0;  // not reached: every enumerator has its case
}

constexpr bool RowsAreInEnumOrder() {
  for (size_t i = 0; i < std::size(kSchedulerKinds); ++i) {
    if (RowOf(kSchedulerKinds[i].kind) != i) return false;
  }
  return true;
}
static_assert(RowsAreInEnumOrder(), "kSchedulerKinds must list each kind once, in enum order");

// Every row spelled by `spell`, joined as "a or b or c".
template <typename Spell>
std::string JoinRows(Spell spell) {
  std::string out;
  for (const SchedulerKindTraits& row : kSchedulerKinds) {
    if (!out.empty()) out += " or ";
    out += spell(row);
  }
  return out;
}

}  // namespace

const SchedulerKindTraits& TraitsOf(SchedulerKind kind) { return kSchedulerKinds[RowOf(kind)]; }

std::optional<SchedulerKind> SchedulerKindFromName(absl::string_view name) {
  for (const SchedulerKindTraits& row : kSchedulerKinds) {
    if (name == row.name || name == row.alias) return row.kind;
  }
  return std::nullopt;
}

std::string SchedulerKindNames() {
  return JoinRows([](const SchedulerKindTraits& row) { return std::string(row.name); });
}

std::string SchedulerKindSpellings() {
  return JoinRows([](const SchedulerKindTraits& row) {
    return absl::StrCat(row.name, " (or ", row.alias, ")");
  });
}

}  // namespace rollpack
