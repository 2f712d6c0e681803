#include "server/store/recompute_book.h"

#include <algorithm>
#include <utility>

#include "rollpack/v1/member.pb.h"

namespace rollpack {
namespace {

// Records stay far below the log's 2 GiB limit and protobuf's.
constexpr int64_t kMaxRoutingRecordBytes = int64_t{256} << 20;

// The log bytes one sample's routing takes in a record: its ids, its id and
// a share of the framing (what replacing or erasing it makes dead).
int64_t LoggedRoutingBytes(const std::string& sample_id, const std::string& routing) {
  return static_cast<int64_t>(routing.size() + sample_id.size()) + 16;
}

}  // namespace

std::shared_ptr<const std::string> RecomputeBook::Find(const std::string& sample_id) const {
  auto it = routing_.find(sample_id);
  return it == routing_.end() ? nullptr : it->second.ids;
}

int64_t RecomputeBook::BytesOf(const std::string& sample_id) const {
  auto it = routing_.find(sample_id);
  return it == routing_.end() ? 0 : static_cast<int64_t>(it->second.ids->size());
}

RecomputeBook::Change RecomputeBook::Store(const std::string& sample_id, std::string routing) {
  Entry entry;
  entry.logged_bytes = LoggedRoutingBytes(sample_id, routing);
  entry.ids = std::make_shared<const std::string>(std::move(routing));
  Change change;
  change.bytes = static_cast<int64_t>(entry.ids->size());
  auto [it, inserted] = routing_.try_emplace(sample_id);
  if (!inserted) {
    change.bytes -= static_cast<int64_t>(it->second.ids->size());
    change.dead_log_bytes = it->second.logged_bytes;
  }
  it->second = std::move(entry);
  return change;
}

RecomputeBook::Change RecomputeBook::Erase(const std::string& sample_id) {
  Change change;
  auto it = routing_.find(sample_id);
  if (it == routing_.end()) return change;
  change.bytes = -static_cast<int64_t>(it->second.ids->size());
  change.dead_log_bytes = it->second.logged_bytes;
  routing_.erase(it);
  return change;
}

int64_t RecomputeBook::LoggedBytes() const {
  int64_t bytes = 0;
  for (const auto& [id, entry] : routing_) bytes += entry.logged_bytes;
  return bytes;
}

std::vector<std::string> RecomputeBook::EncodeRecords(const std::string& pool) const {
  std::vector<std::string> ids;
  ids.reserve(routing_.size());
  for (const auto& [id, entry] : routing_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  std::vector<const std::string*> parts;
  parts.reserve(ids.size());
  for (const std::string& id : ids) parts.push_back(routing_.at(id).ids.get());
  return EncodeCommit(pool, "", ids, parts);
}

std::vector<std::string> RecomputeBook::EncodeCommit(const std::string& pool,
                                                     const std::string& step_id,
                                                     absl::Span<const std::string> ids,
                                                     absl::Span<const std::string* const> routing) {
  std::vector<v1::RecomputeRoutingRecord> records(1);
  int64_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (bytes > 0 && bytes + static_cast<int64_t>(routing[i]->size()) > kMaxRoutingRecordBytes) {
      records.emplace_back();
      bytes = 0;
    }
    records.back().add_sample_ids(ids[i]);
    records.back().add_experts(*routing[i]);
    bytes += static_cast<int64_t>(routing[i]->size() + ids[i].size());
  }
  std::vector<std::string> out;
  for (size_t part = 0; part < records.size(); ++part) {
    v1::RecomputeRoutingRecord& record = records[part];
    if (record.sample_ids().empty()) continue;
    record.set_pool(pool);
    record.set_step_id(step_id);
    if (!step_id.empty() && records.size() > 1) {
      record.set_part(static_cast<int32_t>(part));
      record.set_parts(static_cast<int32_t>(records.size()));
    }
    out.push_back(record.SerializeAsString());
  }
  return out;
}

}  // namespace rollpack
