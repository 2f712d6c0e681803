// SampleStore's log compaction (server/store/durable_log.h): the live state
// rewritten as records that replay to it, so released samples' bytes go.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rollpack/v1/member.pb.h"
#include "base/status_macros.h"
#include "server/store/durable_log.h"
#include "server/store/log_records.h"
#include "server/store/sample_store.h"

namespace rollpack {

absl::Status SampleStore::CompactLog() {
  if (log_ == nullptr) return absl::FailedPreconditionError("no durable log");
  // Readers (fetches, GetPool) go on; writers wait until the new log is in
  // place, so no record can fall between the snapshot and the swap.
  absl::ReaderMutexLock lock(&mu_);
  return log_->Rewrite([&](DurableLog::Rewriter* out) -> absl::Status {
    struct Item {
      uint64_t arrival;
      const std::string* pool;
      const StoredSample* sample;
    };
    std::vector<Item> items;
    for (const auto& [name, pool] : pools_) {
      if (absl::Status s = out->Add(RecordType::kRegisterModel,
                                    EncodeRegisterModel(name, pool.model, pool.options));
          !s.ok()) {
        return s;
      }
      for (const auto& [id, sample] : pool.samples) {
        items.push_back({pool.arrival_of.at(id), &name, sample.get()});
      }
    }
    // Samples in arrival order, so the recovered free list is in the same order.
    std::sort(items.begin(), items.end(),
              [](const Item& a, const Item& b) { return a.arrival < b.arrival; });
    constexpr int64_t kChunkBytes = 8 << 20;
    for (size_t i = 0; i < items.size();) {
      std::vector<const StoredSample*> chunk;
      int64_t bytes = 0;
      size_t j = i;
      for (; j < items.size() && *items[j].pool == *items[i].pool && (chunk.empty() || bytes < kChunkBytes); ++j) {
        chunk.push_back(items[j].sample);
        bytes += EncodedSampleBytes(*items[j].sample);
      }
      const RecordType type = SamplesRecordType(absl::MakeConstSpan(chunk));
      if (absl::Status s =
              out->Add(type, EncodeSamples(*items[i].pool, absl::MakeConstSpan(chunk), type));
          !s.ok()) {
        return s;
      }
      i = j;
    }
    // Open samples, each as one snapshot with its pieces' bounds (they start
    // open again), by id so the same state compacts to the same bytes.
    for (const auto& [name, pool] : pools_) {
      std::vector<const StoredSample*> open;
      for (const auto& [id, sample] : pool.open) open.push_back(&sample.sample);
      std::sort(open.begin(), open.end(), [](const StoredSample* a, const StoredSample* b) {
        return a->sample_id < b->sample_id;
      });
      for (const StoredSample* sample : open) {
        RETURN_IF_ERROR(out->Add(RecordType::kPieceSamples,
                                 EncodeSamples(name, absl::MakeConstSpan(&sample, 1),
                                               RecordType::kPieceSamples)));
      }
    }
    // What the lifecycle added to the samples: versions, counters, uses.
    for (const auto& [name, pool] : pools_) {
      if (pool.policy_version > 0) {
        RETURN_IF_ERROR(out->Add(RecordType::kSetPolicyVersion,
                                 EncodeSetPolicyVersion(name, pool.policy_version)));
      }
      // Counters, and the expired groups that still have samples in steps.
      std::vector<std::string> expired;
      for (const auto& [id, group] : pool.groups) {
        if (group.expired) expired.push_back(id);
      }
      std::sort(expired.begin(), expired.end());
      if (pool.stale_dropped > 0) {
        v1::DroppedSamplesRecord stale;
        stale.set_pool(name);
        stale.set_reason(v1::DroppedSamplesRecord::STALE);
        stale.set_num_samples_counted(pool.stale_dropped);
        RETURN_IF_ERROR(out->Add(RecordType::kDropSamples, stale.SerializeAsString()));
      }
      if (pool.incomplete_groups_dropped > 0 || !expired.empty()) {
        v1::DroppedSamplesRecord groups;
        groups.set_pool(name);
        groups.set_reason(v1::DroppedSamplesRecord::INCOMPLETE_GROUP);
        groups.set_num_groups(pool.incomplete_groups_dropped);
        for (const std::string& id : expired) groups.add_group_ids(id);
        RETURN_IF_ERROR(out->Add(RecordType::kDropSamples, groups.SerializeAsString()));
      }
      if (!pool.uses.empty()) {
        // Sorted, so the same state compacts to the same bytes.
        std::vector<std::pair<std::string, int32_t>> uses(pool.uses.begin(), pool.uses.end());
        std::sort(uses.begin(), uses.end());
        v1::SampleUsesRecord record;
        record.set_pool(name);
        for (const auto& [id, count] : uses) {
          record.add_sample_ids(id);
          record.add_uses(count);
        }
        RETURN_IF_ERROR(out->Add(RecordType::kSampleUses, record.SerializeAsString()));
      }
    }
    // R2: samples' recompute routing, before the steps that replay it.
    for (const auto& [name, pool] : pools_) {
      for (const std::string& record : EncodeRecomputeRouting(name, pool)) {
        RETURN_IF_ERROR(out->Add(RecordType::kRecomputeRouting, record));
      }
    }
    for (const auto& [id, step] : steps_) {
      RETURN_IF_ERROR(out->Add(RecordType::kCreateStep, EncodeCreateStep(*step)));
    }
    for (const auto& [id, hold] : holds_) {
      RETURN_IF_ERROR(out->Add(RecordType::kHoldSamples,
                               EncodeHoldSamples(id, hold.pool, hold.sample_ids, hold.coordinator,
                                                 hold.attempt, hold.reuse_samples,
                                                 hold.recompute)));
    }
    return absl::OkStatus();
  });
}

absl::Status SampleStore::SyncRelease(int64_t ticket) {
  if (log_ == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(log_->Sync(ticket));
  if (log_->ShouldCompact()) {
    // The release is durable whatever compaction does; a failed compaction
    // leaves the old log in place, is counted by the log (its metric and
    // last error) and is retried at the next release.
    CompactLog().IgnoreError();
  }
  return absl::OkStatus();
}

}  // namespace rollpack
