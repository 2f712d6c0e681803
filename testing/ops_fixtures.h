// Helpers shared by the operations end-to-end tests (tests/metrics_test.cc,
// auth_test.cc, tls_test.cc, limits_test.cc): generic calls, temporary
// directories, a small model and its synthetic samples.
#ifndef ROLLPACK_TESTING_OPS_FIXTURES_H_
#define ROLLPACK_TESTING_OPS_FIXTURES_H_

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "rollpack/v1/rollouts.pb.h"
#include "rollpack/v1/scheduler.pb.h"
#include "testing/synthetic_rollouts.h"

namespace rollpack {

// Tokens of the three roles in the test token files (server/ops/auth.h).
inline constexpr char kProducer[] = "producer-token-0123456789";
inline constexpr char kTrainer[] = "trainer-token-0123456789";
inline constexpr char kAdmin[] = "admin-token-0123456789abc";

// Calls `method` (registered or not) with an empty request through the
// generic stub and returns its status.
inline grpc::Status EmptyUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                            grpc::ClientContext* ctx, const std::string& method) {
  grpc::GenericStub generic(channel);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  generic.UnaryCall(ctx, method, grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
  done.WaitForNotification();
  return status;
}

// A fresh directory under $TMPDIR, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "rollpack-ops-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("qwen-like");
  m.set_num_layers(4);
  m.set_num_experts(32);
  m.set_topk(4);
  return m;
}

inline std::vector<v1::Sample> Samples(int num, int64_t max_length, uint64_t seed = 1) {
  SyntheticOptions options;
  options.num_samples = num;
  options.median_length = static_cast<double>(max_length) / 4;
  options.max_length = max_length;
  options.seed = seed;
  return MakeSyntheticRollouts(Model(), options);
}

inline v1::CreateStepRequest StepRequest(const std::string& step_id, const std::string& pool, int num,
                                  int dp, int64_t max_tokens) {
  v1::CreateStepRequest create;
  create.set_step_id(step_id);
  create.set_pool(pool);
  create.set_num_samples(num);
  create.mutable_topology()->set_dp(dp);
  create.mutable_topology()->set_max_tokens_per_rank(max_tokens);
  return create;
}

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_OPS_FIXTURES_H_
