#include "cli/bench/annotations.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/bench/support.h"
#include "client/cpp/client.h"
#include "grpcpp/grpcpp.h"
#include "rollpack/v1/rollouts.grpc.pb.h"
#include "server/server.h"
#include "testing/etcd_process.h"

namespace rollpack {
namespace {

struct Row {
  std::string name;
  std::vector<double> per_second;   // annotations per second, per round
  std::vector<double> request_ms;   // every request of every round
  bool complete = true;
};

// Reports a failed row; the command's exit code.
int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "rollpack bench lifecycle --annotations: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  return 1;
}

// One round on `servers` (annotated through servers[0]): a fresh pool whose
// samples are spread round-robin, then every sample annotated once.
absl::Status RunRound(const std::vector<std::unique_ptr<RollpackServer>>& servers,
                      const AnnotationBenchConfig& config, int round, Row& row) {
  const std::string pool = absl::StrCat("annotate-", round);
  v1::RegisterModelRequest registration;
  registration.set_pool(pool);
  *registration.mutable_model() = BenchDenseModel();
  registration.mutable_options()->add_required_scalars("reward");
  RollpackClient first(MakeChannel(servers[0]->address()));
  if (absl::Status s = first.RegisterModel(registration).status(); !s.ok()) return s;
  const size_t holders = servers.size();
  for (size_t m = 0; m < holders; ++m) {
    RollpackClient client(MakeChannel(servers[m]->address()));
    std::vector<v1::Sample> batch;
    for (int64_t i = static_cast<int64_t>(m); i < config.samples;
         i += static_cast<int64_t>(holders)) {
      batch.push_back(OneTokenSample(absl::StrCat("s", i), 1));
      if (batch.size() == 4096) {
        if (absl::Status s = client.PutSamples(pool, batch).status(); !s.ok()) return s;
        batch.clear();
      }
    }
    if (!batch.empty()) {
      if (absl::Status s = client.PutSamples(pool, batch).status(); !s.ok()) return s;
    }
  }
  absl::StatusOr<v1::PoolInfo> before = first.GetPool(pool);
  if (!before.ok()) return before.status();
  if (before->num_unannotated_samples() != config.samples) {
    return absl::InternalError(absl::StrCat("before: ", before->num_unannotated_samples(),
                                            " unannotated samples, not ", config.samples));
  }

  auto stub = v1::Rollouts::NewStub(MakeChannel(servers[0]->address()));
  const absl::Time start = absl::Now();
  for (int64_t begin = 0; begin < config.samples; begin += config.batch) {
    v1::AnnotateSamplesRequest request;
    request.set_pool(pool);
    const int64_t end = std::min<int64_t>(config.samples, begin + config.batch);
    for (int64_t i = begin; i < end; ++i) {
      v1::SampleAnnotation* a = request.add_annotations();
      a->set_sample_id(absl::StrCat("s", i));
      (*a->mutable_scalars())["reward"] = static_cast<double>(i % 7) / 7.0;
    }
    grpc::ClientContext context;
    v1::AnnotateSamplesResponse response;
    const absl::Time sent = absl::Now();
    const grpc::Status status = stub->AnnotateSamples(&context, request, &response);
    row.request_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - sent));
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    if (response.annotated() != end - begin) {
      return absl::InternalError(absl::StrCat("annotated ", response.annotated(), " of ",
                                              end - begin));
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  row.per_second.push_back(static_cast<double>(config.samples) / seconds);
  absl::StatusOr<v1::PoolInfo> after = first.GetPool(pool);
  if (!after.ok()) return after.status();
  if (after->num_unannotated_samples() != 0) row.complete = false;
  return absl::OkStatus();
}

absl::Status RunRow(std::vector<std::unique_ptr<RollpackServer>> servers,
                    const AnnotationBenchConfig& config, Row& row) {
  for (int round = 0; round < config.rounds; ++round) {
    if (absl::Status s = RunRound(servers, config, round, row); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(row.name, ", round ", round, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RollpackServer>> StartServer(const std::string& data_dir,
                                                            const std::string& etcd_url) {
  ServerOptions options;
  options.max_memory_bytes = int64_t{8} << 30;
  options.max_samples_per_step = 0;
  options.data_dir = data_dir;
  if (!etcd_url.empty()) {
    options.cluster_etcd = {etcd_url};
    options.cluster_name = "bench-annotations";
  }
  return RollpackServer::Start(options);
}

}  // namespace

int RunAnnotationBench(const AnnotationBenchConfig& config) {
  std::vector<Row> rows;
  {
    Row row{"one rollpackd, in memory"};
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = StartServer("", "");
    if (!server.ok()) return Fail("start", server.status());
    std::vector<std::unique_ptr<RollpackServer>> servers;
    servers.push_back(*std::move(server));
    if (absl::Status s = RunRow(std::move(servers), config, row); !s.ok()) return Fail("row", s);
    rows.push_back(std::move(row));
  }
  {
    Row row{"one rollpackd, durable (--data-dir)"};
    char dir_template[] = "/tmp/rollpack-bench-annotations-XXXXXX";
    const char* dir = mkdtemp(dir_template);
    if (dir == nullptr) return Fail("mkdtemp", absl::InternalError("no temporary folder"));
    absl::Status result;
    {
      absl::StatusOr<std::unique_ptr<RollpackServer>> server = StartServer(dir, "");
      if (!server.ok()) {
        result = server.status();
      } else {
        std::vector<std::unique_ptr<RollpackServer>> servers;
        servers.push_back(*std::move(server));
        result = RunRow(std::move(servers), config, row);
      }
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    if (!result.ok()) return Fail("row", result);
    rows.push_back(std::move(row));
  }
  if (config.members > 0) {
    Row row{absl::StrCat("cluster of ", config.members, ", through one member")};
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start();
    if (!etcd.ok()) return Fail("etcd (Debian etcd-server)", etcd.status());
    std::vector<std::unique_ptr<RollpackServer>> servers;
    for (int m = 0; m < config.members; ++m) {
      absl::StatusOr<std::unique_ptr<RollpackServer>> server =
          StartServer("", (*etcd)->client_url());
      if (!server.ok()) return Fail(absl::StrCat("member ", m), server.status());
      servers.push_back(*std::move(server));
    }
    if (absl::Status s = RunRow(std::move(servers), config, row); !s.ok()) return Fail("row", s);
    rows.push_back(std::move(row));
  }

  std::printf("AnnotateSamples: %lld one-token samples, %d per request, %d rounds (median)\n",
              static_cast<long long>(config.samples), config.batch, config.rounds);
  std::printf("%-40s %16s %14s %14s %10s\n", "", "annotations/s", "request p50", "request p99",
              "vs first");
  const double base = Median(rows.front().per_second);
  bool ok = true;
  std::vector<std::string> json_rows;
  for (const Row& row : rows) {
    std::vector<double> sorted = row.request_ms;
    std::sort(sorted.begin(), sorted.end());
    const double p99 = sorted.empty() ? 0 : sorted[(sorted.size() * 99) / 100];
    const double rate = Median(row.per_second);
    std::printf("%-40s %16.0f %11.2f ms %11.2f ms %10.2f%s\n", row.name.c_str(), rate,
                Median(row.request_ms), p99, rate / base,
                row.complete ? "" : "  (samples left unannotated)");
    ok = ok && row.complete;
    json_rows.push_back(absl::StrFormat(
        R"({"row": "%s", "annotations_per_second": %.0f, "request_p50_ms": %.3f, "request_p99_ms": %.3f, "complete": %s})",
        row.name, rate, Median(row.request_ms), p99, row.complete ? "true" : "false"));
  }
  std::printf("{\"bench\": \"annotations\", \"samples\": %lld, \"batch\": %d, \"rows\": [%s]}\n",
              static_cast<long long>(config.samples), config.batch,
              absl::StrJoin(json_rows, ", ").c_str());
  return ok ? 0 : 1;
}

}  // namespace rollpack
