// A test that runs one durable rollpackd (--data-dir, --fsync=always) as a
// child process over a fresh directory, so that it can kill it and start it
// again on the same data: what the cross-process recovery tests share.
#ifndef ROLLPACK_TESTING_DURABLE_DAEMON_TEST_H_
#define ROLLPACK_TESTING_DURABLE_DAEMON_TEST_H_

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/daemon_process.h"

namespace rollpack {

class DurableDaemonTest : public ::testing::Test {
 protected:
  // `rollpackd`: the binary (the test's ROLLPACKD_PATH).
  explicit DurableDaemonTest(std::string rollpackd) : rollpackd_(std::move(rollpackd)) {}

  void SetUp() override {
    char tmpl[] = "/tmp/rollpack_durable_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr) << "mkdtemp " << tmpl;
    dir_ = tmpl;
  }
  void TearDown() override {
    daemon_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Starts rollpackd on dir_, on 127.0.0.1:`port` (0: an ephemeral port).
  // Call under ASSERT_NO_FATAL_FAILURE: a daemon that does not come up fails
  // the test here.
  void StartDaemon(int port = 0) {
    std::vector<std::string> args = {"--data-dir=" + dir_, "--fsync=always"};
    if (port > 0) args.push_back(absl::StrCat("--listen=127.0.0.1:", port));
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
        DaemonProcess::Start(rollpackd_, args, dir_ + "/port");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    if (port > 0) {
      ASSERT_EQ(daemon_->port(), port);
    }
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;

 private:
  const std::string rollpackd_;
};

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_DURABLE_DAEMON_TEST_H_
