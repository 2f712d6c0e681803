#include "server/cluster/member_health.h"

#include <algorithm>

namespace rollpack {

bool MemberHealth::NeedsRoster(const std::set<std::string>& listed) const {
  if (!started_) return true;
  return std::any_of(up_.begin(), up_.end(), [&listed](const auto& member) {
    return member.second && listed.count(member.first) == 0;
  });
}

bool MemberHealth::HasLost() const {
  return std::any_of(up_.begin(), up_.end(), [](const auto& member) { return !member.second; });
}

std::vector<MemberHealth::Event> MemberHealth::Update(
    const std::set<std::string>& listed, const std::optional<std::set<std::string>>& roster,
    bool rejoin_window) {
  std::vector<Event> events;
  if (!started_) {
    started_ = true;
    for (const std::string& id : listed) up_[id] = true;
    if (roster.has_value()) {
      for (const std::string& id : *roster) up_.emplace(id, false);
    }
    return events;
  }
  for (const std::string& id : listed) {
    auto [it, inserted] = up_.emplace(id, true);
    if (inserted || !it->second) events.push_back({Event::Kind::kJoined, id});
    it->second = true;
  }
  for (auto it = up_.begin(); it != up_.end();) {
    const std::string& id = it->first;
    if (listed.count(id) > 0 || !roster.has_value()) {
      ++it;
      continue;
    }
    const bool in_roster = roster->count(id) > 0;
    if (it->second) {
      if (rejoin_window) {
        ++it;
      } else if (in_roster) {
        events.push_back({Event::Kind::kLost, id});
        it->second = false;
        ++it;
      } else {
        events.push_back({Event::Kind::kLeft, id});
        it = up_.erase(it);
      }
    } else if (!in_roster) {
      // A lost member's roster entry ran out: it is not coming back as it
      // was, and stops being reported.
      it = up_.erase(it);
    } else {
      ++it;
    }
  }
  return events;
}

}  // namespace rollpack
