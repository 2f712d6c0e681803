// `rollpack bench lifecycle --annotations N`: how fast rewards given after
// the fact are taken (issue 38; lifecycle.md section 6). A pool of N
// one-token samples with required_scalars = ["reward"], annotated in
// requests of B samples, on one rollpackd (in memory, then durable) and on
// a cluster whose samples are spread over M members and annotated through
// one of them (so most of each request goes to other owners, in two
// phases). Every row checks that the pool ends with no unannotated sample.
#ifndef ROLLPACK_CLI_BENCH_ANNOTATIONS_H_
#define ROLLPACK_CLI_BENCH_ANNOTATIONS_H_

#include <cstdint>

namespace rollpack {

struct AnnotationBenchConfig {
  int64_t samples = 100000;
  // Annotations per AnnotateSamples request.
  int batch = 1000;
  // Cluster members holding the samples; 0 skips the cluster row.
  int members = 3;
  int rounds = 3;
};

// Prints a table and a JSON line; 0 when every row annotated every sample.
int RunAnnotationBench(const AnnotationBenchConfig& config);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_ANNOTATIONS_H_
