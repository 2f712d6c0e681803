// Step records as members read them from etcd (server/cluster/step_record.h),
// any bytes. Oracle: parsing and StepFromRecord never crash, and refuse with
// DATA_LOSS only; a record they accept is encoded for every rank and
// micro-batch from samples of exactly its lengths, and from samples where one
// is a token shorter than its record says, every micro-batch holding that
// sample is refused with DATA_LOSS, never gathered (the memory disclosure of
// issue 36).
#include <string>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "google/protobuf/stubs/logging.h"
#include "rollpack/v1/member.pb.h"
#include "server/cluster/step_record.h"
#include "server/delivery/microbatch_encoder.h"

using namespace rollpack;

namespace {

// Bounds the work per input: records of more tokens are only planned.
constexpr int64_t kMaxEncodedTokens = 1 << 14;

// [tokens, stored layers, K] ids of the store's width, all expert 0.
std::string RoutingOf(const ModelSpec& model, int64_t tokens) {
  return std::string(
      static_cast<size_t>(tokens) * model.stored_layers() * model.topk * model.stored_id_bytes(),
      '\0');
}

std::shared_ptr<const StoredSample> SampleOf(const Step& step, int seq, int64_t tokens) {
  auto s = std::make_shared<StoredSample>();
  s->sample_id = step.sample_ids[seq];
  s->tokens.assign(tokens, 7);
  s->experts = RoutingOf(step.model, tokens);
  s->row_valid.assign(tokens, 1);
  return s;
}

// Whether every micro-batch of every rank encodes (want_ok) or, where it
// holds sequence `short_seq`, is refused with DATA_LOSS.
void EncodeEveryRank(const Step& step, const std::vector<std::shared_ptr<const StoredSample>>& samples,
                     int short_seq) {
  const Topology& t = step.topology;
  // A RECOMPUTE step replays routing committed for it (R2): one per sample,
  // of its sample's length.
  std::vector<std::shared_ptr<const std::string>> routing;
  if (step.replay.source == ReplaySourceKind::kRecompute) {
    for (const auto& sample : samples) {
      routing.push_back(
          std::make_shared<const std::string>(RoutingOf(step.model, sample->num_tokens())));
    }
  }
  MicrobatchEncoder encoder;
  std::string out;
  for (int dp = 0; dp < t.dp; ++dp) {
    for (int cp = 0; cp < t.cp; ++cp) {
      for (int tp = 0; tp < t.tp; ++tp) {
        for (int pp = 0; pp < t.pp; ++pp) {
          for (int index = 0; index < step.layout.num_microbatches(); ++index) {
            MicrobatchRequest request{{dp, cp, tp, pp}, index, false};
            request.recompute_routing = routing;
            absl::Status prepared = encoder.Prepare(step, request, samples);
            RankMicrobatchLayout rank;
            FUZZ_CHECK(step.layout.Describe(request.rank, index, &rank).ok());
            bool holds_short = false;
            for (int seq : rank.group->sequences) holds_short |= seq == short_seq;
            if (holds_short) {
              FUZZ_CHECK(prepared.code() == absl::StatusCode::kDataLoss);
              continue;
            }
            FUZZ_CHECK(prepared.ok());
            out.assign(encoder.encoded_size(), '\0');
            FUZZ_CHECK(encoder.Encode(absl::MakeSpan(out)).ok());
          }
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static google::protobuf::LogSilencer* quiet = new google::protobuf::LogSilencer();
  (void)quiet;
  v1::ClusterStepRecord record;
  if (!record.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<std::shared_ptr<const Step>> step = StepFromRecord(record.step_id(), record);
  if (!step.ok()) {
    FUZZ_CHECK(step.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  const Step& s = **step;
  FUZZ_CHECK(static_cast<int>(s.sample_ids.size()) == record.sample_ids_size());
  int64_t total = 0;
  for (int64_t n : s.layout.lengths()) total += n;
  if (total > kMaxEncodedTokens || s.topology.dp * s.topology.cp * s.topology.tp *
                                           s.topology.pp > 64) {
    return 0;
  }
  std::vector<std::shared_ptr<const StoredSample>> samples;
  for (int i = 0; i < record.sample_ids_size(); ++i) {
    samples.push_back(SampleOf(s, i, record.num_tokens(i)));
  }
  EncodeEveryRank(s, samples, /*short_seq=*/-1);
  // The first sample a token shorter than its record: never gathered.
  if (record.num_tokens(0) > 1) {
    samples[0] = SampleOf(s, 0, record.num_tokens(0) - 1);
    EncodeEveryRank(s, samples, /*short_seq=*/0);
  }
  return 0;
}
