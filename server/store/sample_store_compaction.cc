// SampleStore's log compaction (server/store/durable_log.h): the live state
// rewritten as records that replay to it, so released samples' bytes go.
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rollpack/v1/member.pb.h"
#include "base/status_macros.h"
#include "server/store/durable_log.h"
#include "server/store/log_records.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace {

// The samples' later scalars (lifecycle.md section 6) as one kAnnotations
// record, which replays them as added after the samples were put.
std::string EncodeLaterScalars(const std::string& pool,
                               absl::Span<const StoredSample* const> samples) {
  std::vector<ScalarAnnotation> annotations;
  annotations.reserve(samples.size());
  for (const StoredSample* sample : samples) {
    ScalarAnnotation a{sample->sample_id, {}};
    for (const std::string& name : sample->later_scalars) {
      a.scalars.emplace(name, sample->scalars.at(name));
    }
    annotations.push_back(std::move(a));
  }
  return EncodeAnnotations(pool, annotations);
}

}  // namespace

absl::Status SampleStore::CompactLog() {
  if (log_ == nullptr) return absl::FailedPreconditionError("no durable log");
  // Readers (fetches, GetPool) go on; writers wait until the new log is in
  // place, so no record can fall between the snapshot and the swap.
  absl::ReaderMutexLock lock(&mu_);
  return log_->Rewrite([&](DurableLog::Rewriter* out) -> absl::Status {
    // Sealed samples as they were put, in arrival order, so the recovered
    // free list is in the same order; and each one's later scalars
    // (lifecycle.md section 6) as kAnnotations records where their order
    // matters: when an annotation completed it (its ready sequence), or
    // right after it when it was complete when sealed (a sealing piece's
    // scalars). Any other sample's later scalars go after every sample.
    struct Item {
      uint64_t key;  // 2 * sequence, + 1 right after that sequence
      bool annotations;
      const std::string* pool;
      const StoredSample* sample;
    };
    std::vector<Item> items;
    std::map<std::string, std::vector<const StoredSample*>> unordered;
    for (const auto& [name, pool] : pools_) {
      if (absl::Status s = out->Add(RecordType::kRegisterModel,
                                    EncodeRegisterModel(name, pool.model, pool.options));
          !s.ok()) {
        return s;
      }
      for (const auto& [id, sample] : pool.samples) {
        const uint64_t arrival = pool.arrival_of.at(id);
        items.push_back({2 * arrival, false, &name, sample.get()});
        if (sample->later_scalars.empty()) continue;
        if (auto ready = pool.ready_at.find(id); ready != pool.ready_at.end()) {
          items.push_back({2 * ready->second.seq, true, &name, sample.get()});
        } else if (pool.MissingScalar(*sample) == nullptr &&
                   std::any_of(sample->later_scalars.begin(), sample->later_scalars.end(),
                               [&required = pool.options.required_scalars](
                                   const std::string& later) {
                                 return std::binary_search(required.begin(), required.end(),
                                                           later);
                               })) {
          items.push_back({2 * arrival + 1, true, &name, sample.get()});
        } else {
          unordered[name].push_back(sample.get());
        }
      }
    }
    std::sort(items.begin(), items.end(),
              [](const Item& a, const Item& b) { return a.key < b.key; });
    constexpr int64_t kChunkBytes = 8 << 20;
    for (size_t i = 0; i < items.size();) {
      std::vector<const StoredSample*> chunk;
      int64_t bytes = 0;
      size_t j = i;
      for (; j < items.size() && *items[j].pool == *items[i].pool &&
             items[j].annotations == items[i].annotations && (chunk.empty() || bytes < kChunkBytes);
           ++j) {
        chunk.push_back(items[j].sample);
        bytes += items[j].annotations ? 256 : EncodedSampleBytes(*items[j].sample);
      }
      if (items[i].annotations) {
        RETURN_IF_ERROR(out->Add(RecordType::kAnnotations,
                                 EncodeLaterScalars(*items[i].pool, chunk)));
      } else {
        const RecordType type = SamplesRecordType(absl::MakeConstSpan(chunk));
        RETURN_IF_ERROR(out->Add(type, EncodeSamples(*items[i].pool, absl::MakeConstSpan(chunk),
                                                     type, /*as_put=*/true)));
      }
      i = j;
    }
    // Open samples, each as one snapshot with its pieces' bounds (they start
    // open again), by id so the same state compacts to the same bytes; then
    // the later scalars whose order does not matter.
    for (const auto& [name, pool] : pools_) {
      std::vector<const StoredSample*> open;
      for (const auto& [id, sample] : pool.open) open.push_back(&sample.sample);
      std::sort(open.begin(), open.end(), [](const StoredSample* a, const StoredSample* b) {
        return a->sample_id < b->sample_id;
      });
      for (const StoredSample* sample : open) {
        const RecordType type = SamplesRecordType(absl::MakeConstSpan(&sample, 1));
        RETURN_IF_ERROR(out->Add(type, EncodeSamples(name, absl::MakeConstSpan(&sample, 1),
                                                     type, /*as_put=*/true)));
      }
      std::vector<const StoredSample*>& later = unordered[name];
      for (const StoredSample* sample : open) {
        if (!sample->later_scalars.empty()) later.push_back(sample);
      }
      std::sort(later.begin(), later.end(), [](const StoredSample* a, const StoredSample* b) {
        return a->sample_id < b->sample_id;
      });
      for (size_t i = 0; i < later.size(); i += 4096) {
        const size_t n = std::min<size_t>(4096, later.size() - i);
        RETURN_IF_ERROR(out->Add(RecordType::kAnnotations,
                                 EncodeLaterScalars(name, absl::MakeConstSpan(&later[i], n))));
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
      for (const std::string& record : pool.recompute_routing.EncodeRecords(name)) {
        RETURN_IF_ERROR(out->Add(RecordType::kRecomputeRouting, record));
      }
    }
    for (const auto& [id, step] : steps_) {
      RETURN_IF_ERROR(out->Add(RecordType::kCreateStep, EncodeCreateStep(*step)));
    }
    for (const auto& [id, hold] : holds_) {
      RETURN_IF_ERROR(out->Add(RecordType::kHoldSamples, StepHolds::Record(id, hold)));
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
