// The single server's pool directory (pool_directory.h): every pool is the
// store's own, registered and answered here.
#ifndef ROLLPACK_SERVER_STORE_LOCAL_POOLS_H_
#define ROLLPACK_SERVER_STORE_LOCAL_POOLS_H_

#include <functional>

#include "server/store/pool_directory.h"
#include "server/store/sample_store.h"
#include "server/store/step_directory.h"

namespace rollpack {

class LocalPools final : public PoolDirectory {
 public:
  // `steps`: where a forced DeletePool finds and releases the pool's live
  // steps (null: the store ends them with the pool). `on_step_released` (may
  // be empty) is told of each, as ReleaseStep's caller is.
  LocalPools(SampleStore* store, StepDirectory* steps,
             std::function<void(const ReleaseResult&)> on_step_released = {})
      : store_(store), steps_(steps), on_step_released_(std::move(on_step_released)) {}

  absl::StatusOr<bool> Register(const std::string& pool, const ModelSpec& model,
                                const std::optional<PoolOptions>& options) override {
    return store_->RegisterModel(pool, model, options);
  }
  absl::StatusOr<std::optional<PoolDefinition>> Resolve(const std::string& pool) override {
    return std::nullopt;
  }
  bool FixesSchemasBeforePut() const override { return false; }
  absl::StatusOr<std::map<std::string, FieldSchema>> FixSchema(
      const std::string& pool, const std::map<std::string, FieldSchema>& proposed) override {
    return proposed;
  }
  absl::Status AcceptsNewSamples() const override { return absl::OkStatus(); }
  absl::StatusOr<v1::PoolInfo> GetPool(const std::string& pool) override {
    return GetPoolHere(pool);
  }
  absl::StatusOr<v1::PoolInfo> GetPoolHere(const std::string& pool) const override;
  absl::StatusOr<std::vector<std::string>> PoolNames() override { return store_->PoolNames(); }
  absl::StatusOr<int32_t> Annotate(const std::string& pool,
                                   std::vector<ScalarAnnotation> annotations) override {
    return store_->AnnotateSamples(pool, annotations);
  }
  absl::StatusOr<v1::DeletePoolResponse> DeletePool(
      const v1::DeletePoolRequest& request) override;
  absl::StatusOr<v1::ListSamplesResponse> ListSamples(
      const v1::ListSamplesRequest& request) override;

 private:
  SampleStore* const store_;
  StepDirectory* const steps_;
  const std::function<void(const ReleaseResult&)> on_step_released_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_LOCAL_POOLS_H_
