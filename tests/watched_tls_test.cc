// Watched TLS credentials against a real server: the member identity check
// a cluster member makes of the peer it dialled, and a certificate replaced
// on disk taking effect without a restart.
#include "server/ops/watched_tls.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "testing/test_certificates.h"

namespace rollpack {
namespace {

class WatchedTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / "rollpack-watched-tls-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
    ASSERT_TRUE(MakeTestCertificates(dir_, {"ca"},
                                     {{"member", "rollpack-member", "ca"},
                                      {"trainer", "trainer-1", "ca"}})
                    .ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string File(const std::string& name) const { return dir_ + "/" + name; }

  // Serves with `cert` (a name given to MakeTestCertificates), copied to
  // files of its own so the test can replace them.
  std::unique_ptr<RollpackServer> Serve(const std::string& cert) {
    std::filesystem::copy_file(File(cert + ".crt"), File("serving.crt"),
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(File(cert + ".key"), File("serving.key"),
                               std::filesystem::copy_options::overwrite_existing);
    ServerOptions options;
    options.tls_cert = File("serving.crt");
    options.tls_key = File("serving.key");
    options.tls_refresh = absl::Seconds(1);
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  // Whether a call over `credentials` reaches the server.
  bool Reaches(const RollpackServer& server,
               const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
    grpc::ChannelArguments args;
    args.SetInt("rollpack-distinct", ++channels_);  // a connection of its own
    RollpackClient client(grpc::CreateCustomChannel(server.address(), credentials, args));
    return client.ListPools().ok();
  }

  std::string dir_;
  int channels_ = 0;
};

TEST_F(WatchedTlsTest, AMemberDialsOnlyServersWithTheMemberIdentity) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> as_member =
      WatchedChannelCredentials({File("member.crt"), File("member.key"), File("ca.crt")},
                                absl::Seconds(1), "rollpack-member");
  ASSERT_TRUE(as_member.ok()) << as_member.status();
  std::unique_ptr<RollpackServer> member = Serve("member");
  ASSERT_NE(member, nullptr);
  EXPECT_TRUE(Reaches(*member, *as_member));
  member->Shutdown(absl::ZeroDuration());
  // A certificate of the same CA that is not a member's: the address alone
  // proves nothing.
  std::unique_ptr<RollpackServer> impostor = Serve("trainer");
  ASSERT_NE(impostor, nullptr);
  EXPECT_FALSE(Reaches(*impostor, *as_member));
  impostor->Shutdown(absl::ZeroDuration());
}

TEST_F(WatchedTlsTest, AReplacedCertificateServesWithoutARestart) {
  std::unique_ptr<RollpackServer> server = Serve("trainer");
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> as_member =
      WatchedChannelCredentials({File("member.crt"), File("member.key"), File("ca.crt")},
                                absl::Seconds(1), "rollpack-member");
  ASSERT_TRUE(as_member.ok()) << as_member.status();
  EXPECT_FALSE(Reaches(*server, *as_member));
  std::filesystem::copy_file(File("member.key"), File("serving.key.new"));
  std::filesystem::copy_file(File("member.crt"), File("serving.crt.new"));
  std::filesystem::rename(File("serving.key.new"), File("serving.key"));
  std::filesystem::rename(File("serving.crt.new"), File("serving.crt"));
  bool reached = false;
  for (const absl::Time until = absl::Now() + absl::Seconds(10); !reached && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(200));
    reached = Reaches(*server, *as_member);
  }
  EXPECT_TRUE(reached) << "the replaced certificate was not served within 10 s";
  server->Shutdown(absl::ZeroDuration());
}

TEST_F(WatchedTlsTest, AFileThatIsNotPemIsRefusedAtStart) {
  std::ofstream(File("junk.crt")) << "not a certificate";
  EXPECT_EQ(WatchedServerCredentials({File("junk.crt"), File("member.key"), ""}, absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WatchedChannelCredentials({"", "", File("missing-ca.crt")}, absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rollpack
