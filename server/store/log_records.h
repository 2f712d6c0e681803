// Payloads of the durable log's records (durable_log.h): samples in a
// compact binary form, models and steps as their wire requests.
#ifndef ROLLPACK_SERVER_STORE_LOG_RECORDS_H_
#define ROLLPACK_SERVER_STORE_LOG_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "scheduler/model_spec.h"
#include "server/store/durable_log.h"
#include "server/store/pool_options.h"
#include "server/store/scalar_annotation.h"
#include "server/store/step.h"
#include "server/store/stored_sample.h"

namespace rollpack {

// kPutSamples, kPutGroupedSamples when a sample has a group size,
// kPieceSamples when one is a piece or was sent in pieces, or
// kRaggedSamples when one has a ragged field (so a log without groups
// stays readable by older servers, and one without ragged fields too).
RecordType SamplesRecordType(absl::Span<const StoredSample* const> samples);
RecordType SamplesRecordType(absl::Span<const StoredSample> samples);
// `as_put`: each sample with the scalars it was put with only, its later
// scalars left to kAnnotations records (compaction).
std::string EncodeSamples(absl::string_view pool, absl::Span<const StoredSample> samples,
                          RecordType type = RecordType::kPutSamples, bool as_put = false);
std::string EncodeSamples(absl::string_view pool,
                          absl::Span<const StoredSample* const> samples,
                          RecordType type = RecordType::kPutSamples, bool as_put = false);
absl::Status DecodeSamples(absl::string_view payload, std::string* pool,
                           std::vector<StoredSample>* samples,
                           RecordType type = RecordType::kPutSamples);
// Bytes one sample takes in a kPutSamples payload.
int64_t EncodedSampleBytes(const StoredSample& sample);
// Bytes of the log that hold `sample`: its pieces' records for a sample
// sent in pieces (StoredSample::logged_bytes), else EncodedSampleBytes.
int64_t LoggedSampleBytes(const StoredSample& sample);
// A sample sent in pieces may grow to at most this many encoded bytes, so
// that compaction can write it as one record (a whole sample is bounded by
// --max-message-bytes).
inline constexpr int64_t kMaxEncodedSampleBytes = int64_t{1} << 30;

std::string EncodeRegisterModel(const std::string& pool, const ModelSpec& model,
                                const PoolOptions& options);
std::string EncodeSetPolicyVersion(const std::string& pool, int64_t policy_version);
// Resolved sample ids in the step's order and its normalised topology.
std::string EncodeCreateStep(const Step& step);
std::string EncodeReleaseStep(const std::string& step_id);
std::string EncodeHoldSamples(const std::string& step_id, const std::string& pool,
                              absl::Span<const std::string> sample_ids,
                              const std::string& coordinator, int64_t attempt,
                              bool reuse_samples, bool recompute = false);
std::string EncodeDropHold(const std::string& step_id);
// v1::DeletePoolRequest with the pool alone (kDeletePool): replay deletes it
// whatever it holds then, as the deletion did (its steps were ended first).
std::string EncodeDeletePool(const std::string& pool);
// v1::AnnotationsRecord (kAnnotations), serialized deterministically.
std::string EncodeAnnotations(absl::string_view pool,
                              absl::Span<const ScalarAnnotation> annotations);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_LOG_RECORDS_H_
