// A rollpackd inside the test process on 127.0.0.1:0, with a client, started
// before and stopped after each test.
#ifndef ROLLPACK_TESTING_IN_PROCESS_SERVER_H_
#define ROLLPACK_TESTING_IN_PROCESS_SERVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace rollpack {

class InProcessServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(Options());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = MakeChannel(server_->address());
    client_ = std::make_unique<RollpackClient>(channel_);
  }
  void TearDown() override { server_->Shutdown(absl::Seconds(1)); }

  virtual ServerOptions Options() const { return {}; }

  std::unique_ptr<RollpackServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<RollpackClient> client_;
};

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_IN_PROCESS_SERVER_H_
