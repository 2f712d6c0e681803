#include "server/ops/h2_open_streams.h"

#include <algorithm>

namespace rollpack {

void H2OpenStreams::Opened(uint32_t stream) {
  const int64_t id = stream;
  if ((id & 1) == 0 || id <= highest_) return;
  const int64_t first_new = highest_ < 0 ? 1 : highest_ + 2;
  if (id - first_new >= 2 * kWindow) {
    // A jump past the whole window: every id in it leaves, oldest first.
    for (int64_t old = highest_ - 2 * (kWindow - 1); old <= highest_; old += 2) {
      if (old >= 1 && open_[Slot(old)]) KeepOld(old);
    }
    open_.reset();
  } else {
    // Each new id takes the slot of the id 2 * kWindow below it.
    for (int64_t entering = first_new; entering <= id; entering += 2) {
      const int64_t leaving = entering - 2 * kWindow;
      if (leaving >= 1 && open_[Slot(entering)]) KeepOld(leaving);
      open_[Slot(entering)] = false;
    }
  }
  open_[Slot(id)] = true;
  highest_ = id;
}

void H2OpenStreams::KeepOld(int64_t stream) {
  if (old_open_.size() >= kMaxOldOpen) {
    forgotten_through_ = old_open_.front();
    old_open_.erase(old_open_.begin());
  }
  old_open_.push_back(static_cast<uint32_t>(stream));  // ids leave in ascending order
}

void H2OpenStreams::Ended(uint32_t stream) {
  const int64_t id = stream;
  if ((id & 1) == 0 || id > highest_) return;
  if (InWindow(id)) {
    open_[Slot(id)] = false;
    return;
  }
  const auto it = std::lower_bound(old_open_.begin(), old_open_.end(), stream);
  if (it != old_open_.end() && *it == stream) old_open_.erase(it);
}

bool H2OpenStreams::MayBeOpen(uint32_t stream) const {
  const int64_t id = stream;
  if ((id & 1) == 0 || id > highest_) return true;
  if (InWindow(id)) return open_[Slot(id)];
  return id <= forgotten_through_ || std::binary_search(old_open_.begin(), old_open_.end(), stream);
}

}  // namespace rollpack
