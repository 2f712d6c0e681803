#include "scheduler/sample_selection.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

// A selectable unit: one sample, or a whole complete group, whose
// candidate indices are members[begin, begin + count) of the selection's
// flat member list (no allocation per item: pools hold 10^5 samples).
struct Item {
  int32_t begin = 0;
  int32_t count = 0;
  int64_t num_tokens = 0;
  int64_t version = 0;  // a group's lowest
  int32_t ingest = 0;   // a group's last member: when it became complete
  // A group's members' latest ready_key: when it became complete, where
  // annotations completed it (SampleCandidate::ready_key).
  int64_t ready = 0;
};

// Single samples have ready 0: their ingest order decides.
void SortItems(std::vector<Item>* items, SelectionOrder order) {
  if (order == SelectionOrder::kOldest) {
    std::stable_sort(items->begin(), items->end(), [](const Item& a, const Item& b) {
      if (a.ready != b.ready) return a.ready < b.ready;
      return a.ingest < b.ingest;
    });
  } else {
    // Ties in the order they became complete.
    std::stable_sort(items->begin(), items->end(), [](const Item& a, const Item& b) {
      if (a.version != b.version) return a.version > b.version;
      if (a.ready != b.ready) return a.ready < b.ready;
      return a.ingest < b.ingest;
    });
  }
}

bool Grouped(const SampleCandidate& c) { return c.group_size > 0 && !c.group_id.empty(); }

// What the free samples hold besides what is selectable: stale samples, and
// sealed ones still missing a required scalar (lifecycle.md section 6).
std::string StalenessNote(const SelectionRequest& request, int64_t stale,
                          int64_t unannotated) {
  std::string note;
  if (stale > 0) {
    note = absl::StrCat(" (", stale, " more are stale: policy_version ", request.policy_version,
                        ", max_staleness ", *request.max_staleness, ")");
  }
  if (unannotated > 0) {
    absl::StrAppend(&note, " (", unannotated,
                    " more lack a required scalar: not selectable until annotated)");
  }
  return note;
}

}  // namespace

absl::Status CheckStepSize(int64_t samples, const SelectionRequest& request,
                           absl::string_view what) {
  if (request.max_samples <= 0 || samples <= request.max_samples) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": the step would take ", samples, " samples; the server plans at most ",
      request.max_samples, " per step (--max-samples-per-step): ask for fewer"));
}

bool IsStale(const SelectionRequest& request, int64_t policy_version) {
  if (request.policy_version <= 0 || !request.max_staleness.has_value() ||
      *request.max_staleness < 0) {
    return false;
  }
  // Both are >= 0 here, so the difference cannot overflow (a sample's own
  // version may be any int64).
  return policy_version < request.policy_version - *request.max_staleness;
}

int32_t CountCompleteGroups(absl::Span<const SampleCandidate> samples) {
  absl::flat_hash_map<absl::string_view, std::pair<int32_t, int32_t>> seen;  // count, size
  for (const SampleCandidate& c : samples) {
    if (!Grouped(c)) continue;
    auto& [count, size] = seen[c.group_id];
    ++count;
    size = c.group_size;
  }
  int32_t complete = 0;
  for (const auto& [id, count_size] : seen) {
    if (count_size.first == count_size.second) ++complete;
  }
  return complete;
}

absl::StatusOr<Selection> SelectSamples(absl::Span<const SampleCandidate> candidates,
                                        const SelectionRequest& request, absl::string_view what,
                                        bool prefix) {
  if (prefix && request.order != SelectionOrder::kOldest) {
    return absl::InternalError("a prefix of the free samples decides only OLDEST selections");
  }
  Selection more;
  more.needs_more = true;
  const int set = (request.num_samples > 0) + (request.num_groups > 0) + (request.num_tokens > 0);
  if (set != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": give exactly one of sample_ids, num_samples, num_groups, num_tokens (> 0)"));
  }
  RETURN_IF_ERROR(CheckStepSize(request.num_samples, request, what));
  if (candidates.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": too many free samples to select from"));
  }
  std::vector<Item> items;
  std::vector<int32_t> members;
  int64_t stale = 0;
  int64_t unannotated = 0;
  const bool keyed = std::any_of(candidates.begin(), candidates.end(),
                                 [](const SampleCandidate& c) { return c.ready_key != 0; });
  if (prefix && keyed && request.selects_groups()) {
    // Annotations can complete a group after samples sealed past the
    // prefix: only every free sample decides the groups' order.
    return more;
  }
  if (!request.selects_groups()) {
    items.reserve(candidates.size());
    members.reserve(candidates.size());
    for (size_t i = 0; i < candidates.size(); ++i) {
      const SampleCandidate& c = candidates[i];
      if (IsStale(request, c.policy_version)) {
        ++stale;
        continue;
      }
      if (!c.missing_scalar.empty()) {
        ++unannotated;
        continue;
      }
      const int32_t index = static_cast<int32_t>(i);
      items.push_back(Item{static_cast<int32_t>(members.size()), 1, c.num_tokens,
                           c.policy_version, index});
      members.push_back(index);
    }
  } else {
    // Groups in order of first appearance; a group is selectable when its
    // group_size free, fresh samples agree on the size (members of a
    // cluster cannot check that against each other at ingest).
    absl::flat_hash_map<absl::string_view, int32_t> index;
    std::vector<Item> groups;
    std::vector<bool> selectable;
    std::vector<int32_t> sizes;
    std::vector<int32_t> group_of(candidates.size(), -1);
    for (size_t i = 0; i < candidates.size(); ++i) {
      const SampleCandidate& c = candidates[i];
      if (!Grouped(c)) continue;
      auto [it, inserted] = index.try_emplace(c.group_id, static_cast<int32_t>(groups.size()));
      const int32_t g = it->second;
      if (inserted) {
        groups.emplace_back();
        groups.back().version = c.policy_version;
        selectable.push_back(true);
        sizes.push_back(c.group_size);
      }
      if (IsStale(request, c.policy_version)) {
        ++stale;
        selectable[g] = false;  // never taken without this sample
        continue;
      }
      if (!c.missing_scalar.empty()) {
        ++unannotated;
        selectable[g] = false;  // not complete until annotated
        continue;
      }
      if (c.group_size != sizes[g]) selectable[g] = false;
      group_of[i] = g;
      Item& group = groups[g];
      group.count++;
      group.num_tokens += c.num_tokens;
      group.version = std::min(group.version, c.policy_version);
      group.ingest = static_cast<int32_t>(i);
      group.ready = std::max(group.ready, c.ready_key);
    }
    // Each group's members, contiguous and in ingest order.
    int32_t next = 0;
    for (Item& group : groups) {
      group.begin = next;
      next += group.count;
    }
    members.resize(static_cast<size_t>(next));
    std::vector<int32_t> filled(groups.size(), 0);
    for (size_t i = 0; i < candidates.size(); ++i) {
      const int32_t g = group_of[i];
      if (g >= 0) members[groups[g].begin + filled[g]++] = static_cast<int32_t>(i);
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      if (selectable[g] && groups[g].count == sizes[g]) items.push_back(groups[g]);
    }
  }
  // Single samples are in ingest order already.
  if (request.selects_groups() || request.order != SelectionOrder::kOldest) {
    SortItems(&items, request.order);
  }

  const absl::string_view unit = request.selects_groups() ? "complete free groups" : "free samples";
  const std::string note = StalenessNote(request, stale, unannotated);
  size_t taken = 0;
  int64_t samples = 0;
  int64_t tokens = 0;
  if (request.num_groups > 0) {
    if (static_cast<int64_t>(items.size()) < request.num_groups) {
      if (prefix) return more;
      return absl::FailedPreconditionError(absl::StrCat(what, " has ", items.size(), " ", unit,
                                                        note, ", ", request.num_groups,
                                                        " requested"));
    }
    taken = static_cast<size_t>(request.num_groups);
  } else if (request.num_samples > 0) {
    if (!request.whole_groups) {
      if (static_cast<int64_t>(items.size()) < request.num_samples) {
        if (prefix) return more;
        return absl::FailedPreconditionError(absl::StrCat(what, " has ", items.size(), " ", unit,
                                                          note, ", ", request.num_samples,
                                                          " requested"));
      }
      taken = static_cast<size_t>(request.num_samples);
    } else {
      while (taken < items.size() && samples + items[taken].count <= request.num_samples) {
        samples += items[taken++].count;
      }
      if (samples != request.num_samples) {
        if (prefix && taken == items.size()) return more;
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": whole groups in selection order reach ", samples, " samples, not ",
            request.num_samples,
            taken < items.size()
                ? absl::StrCat(" (the next group has ", items[taken].count, ")")
                : absl::StrCat(" (", items.size(), " ", unit, note, ")")));
      }
    }
  } else {
    int64_t total = 0;
    for (const Item& item : items) total += item.num_tokens;
    if (total < request.num_tokens) {
      if (prefix) return more;
      return absl::FailedPreconditionError(absl::StrCat(
          what, " has ", total, " tokens in ", items.size(), " ", unit,
          note, ", num_tokens ", request.num_tokens, " requested"));
    }
    while (taken < items.size() &&
           (taken == 0 || tokens + items[taken].num_tokens <= request.num_tokens)) {
      tokens += items[taken++].num_tokens;
    }
  }

  int64_t chosen_samples = 0;
  for (size_t k = 0; k < taken; ++k) chosen_samples += items[k].count;
  RETURN_IF_ERROR(CheckStepSize(chosen_samples, request, what));
  Selection selection;
  for (size_t k = 0; k < taken; ++k) {
    for (int32_t m = items[k].begin; m < items[k].begin + items[k].count; ++m) {
      selection.chosen.push_back(members[m]);
      selection.num_tokens += candidates[members[m]].num_tokens;
    }
  }
  if (request.selects_groups()) {
    selection.num_groups = static_cast<int32_t>(taken);
  } else {
    std::vector<SampleCandidate> chosen;
    chosen.reserve(selection.chosen.size());
    for (int32_t i : selection.chosen) chosen.push_back(candidates[i]);
    selection.num_groups = CountCompleteGroups(chosen);
  }
  return selection;
}

absl::StatusOr<int32_t> CheckExplicitSelection(absl::Span<const SampleCandidate> chosen,
                                               const SelectionRequest& request,
                                               absl::string_view what) {
  RETURN_IF_ERROR(CheckStepSize(static_cast<int64_t>(chosen.size()), request, what));
  for (const SampleCandidate& c : chosen) {
    if (IsStale(request, c.policy_version)) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": sample \"", c.sample_id, "\" is stale: its policy_version ", c.policy_version,
          " is older than ", request.policy_version, " - max_staleness ", *request.max_staleness));
    }
    if (!c.missing_scalar.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": sample \"", c.sample_id, "\" lacks scalar \"", c.missing_scalar,
          "\", which the pool requires (required_scalars): it is selectable once annotated "
          "(Rollouts.AnnotateSamples)"));
    }
  }
  if (request.whole_groups) {
    // In the order given, so the error names the first group short.
    absl::flat_hash_map<absl::string_view, int32_t> counts;
    for (const SampleCandidate& c : chosen) {
      if (Grouped(c)) ++counts[c.group_id];
    }
    for (const SampleCandidate& c : chosen) {
      if (!Grouped(c)) continue;  // an ungrouped sample is whole by itself
      const int32_t have = counts.at(c.group_id);
      if (have < c.group_size) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": group \"", c.group_id, "\" is not covered whole: ", c.group_size - have,
            " of its ", c.group_size, " samples are missing"));
      }
    }
  }
  return CountCompleteGroups(chosen);
}

}  // namespace rollpack
