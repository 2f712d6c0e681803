// What the benchmark commands share: the model their synthetic rollouts
// use and the statistic their tables report.
#ifndef ROLLPACK_CLI_BENCH_SUPPORT_H_
#define ROLLPACK_CLI_BENCH_SUPPORT_H_

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "rollpack/v1/rollouts.pb.h"
#include "rollpack/v1/scheduler.pb.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

// This program's path ("" when /proc/self/exe cannot be read).
inline std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// The directory of this program: the benchmarks start the rollpackd beside
// it unless told otherwise.
inline std::string SelfDir() {
  const std::string path = SelfPath();
  return path.empty() ? "." : path.substr(0, path.rfind('/'));
}

// A small MoE model: 4 layers, 64 experts, top-4.
inline v1::ModelSpec BenchModel() {
  v1::ModelSpec m;
  m.set_name("bench-moe");
  m.set_num_layers(4);
  m.set_num_experts(64);
  m.set_topk(4);
  return m;
}

// A dense model (4 layers, no MoE): the benchmarks whose samples are one
// token each, so that only the number of samples grows.
inline v1::ModelSpec BenchDenseModel() {
  v1::ModelSpec m;
  m.set_name("bench-dense");
  m.set_num_layers(4);
  return m;
}

// Sample `id`: one int32 token and nothing else.
inline v1::Sample OneTokenSample(const std::string& id, int32_t token) {
  v1::Sample s;
  s.set_sample_id(id);
  v1::NDArray* tokens = s.mutable_tokens();
  tokens->set_dtype(v1::INT32);
  tokens->add_shape(1);
  tokens->set_data(std::string(reinterpret_cast<const char*>(&token), sizeof(token)));
  return s;
}

// The median of `v` (the upper one of an even count); 0 when empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Every rank of `topology`'s dp x cp grid, dp-major: the ranks a benchmark
// fetches for, one stream each.
inline std::vector<v1::RankCoords> AllRanks(const v1::Topology& topology) {
  std::vector<v1::RankCoords> ranks;
  for (int d = 0; d < topology.dp(); ++d) {
    for (int c = 0; c < topology.cp(); ++c) {
      v1::RankCoords r;
      r.set_dp(d);
      r.set_cp(c);
      ranks.push_back(r);
    }
  }
  return ranks;
}

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_SUPPORT_H_
