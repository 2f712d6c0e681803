// A cluster on a shared network (docs/cluster.md, "Threat model"), with real
// processes: an etcd over TLS with client-certificate auth, auth enabled and
// the members' user limited to the cluster's key prefix; three rollpackd
// members with mutual TLS and token roles. Each attack issue 36 found is a
// test here: a client without a member certificate calling the Member
// service, destructive calls without their role, a rollpackd without
// credentials joining, leaseless and overwritten member keys.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/trainer_stream.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/wire/deterministic_bytes.h"
#include "rollpack/v1/member.grpc.pb.h"
#include "server/cluster/etcd_client.h"
#include "testing/cluster_fixture.h"
#include "testing/exposition.h"
#include "testing/synthetic_rollouts.h"
#include "testing/test_certificates.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

constexpr char kClusterName[] = "trust";
constexpr char kProducerToken[] = "producer-token-0123456789";
constexpr char kTrainerToken[] = "trainer-token-0123456789";
constexpr char kAdminToken[] = "admin-token-0123456789abc";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class ClusterTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / "rollpack-trust-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
    // `member` serves every member (its CN is the member identity and the
    // etcd user); `impostor` claims the same CN from another CA.
    // `ca2` and its certificates replace `ca`'s in the rotation test.
    ASSERT_TRUE(MakeTestCertificates(dir_, {"ca", "rogue", "ca2"},
                                     {{"etcd", "localhost", "ca"},
                                      {"root", "root", "ca"},
                                      {"member", "rollpack-member", "ca"},
                                      {"member-etcd", "rollpack-member", "ca"},
                                      {"member2", "rollpack-member", "ca2"},
                                      {"trainer2", "trainer-2", "ca2"},
                                      {"trainer", "trainer-1", "ca"},
                                      {"stranger", "stranger", "ca"},
                                      {"impostor", "rollpack-member", "rogue"}})
                    .ok());
    std::ofstream(File("tokens")) << "producer " << kProducerToken << "\ntrainer " << kTrainerToken
                                  << "\nadmin " << kAdminToken << "\n";
    chmod(File("tokens").c_str(), 0600);

    EtcdProcessOptions etcd_options;
    etcd_options.server_cert = File("etcd.crt");
    etcd_options.server_key = File("etcd.key");
    etcd_options.client_ca = File("ca.crt");
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start(1, etcd_options);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    // etcd's own auth: root, and a role that may touch the cluster's prefix
    // alone, held by the user the member certificate names.
    for (const std::string& command :
         {std::string("user add root --no-password"), std::string("role add rollpack"),
          absl::StrCat("role grant-permission rollpack --prefix=true readwrite /", kClusterName,
                       "/"),
          std::string("user add rollpack-member --no-password"),
          std::string("user grant-role rollpack-member rollpack"),
          std::string("user add stranger --no-password"), std::string("auth enable")}) {
      ASSERT_EQ(Etcdctl("root", command), 0) << command;
    }
    absl::StatusOr<std::unique_ptr<EtcdClient>> root = EtcdClient::Create(EtcdAs("root"));
    ASSERT_TRUE(root.ok()) << root.status();
    etcd_root_ = *std::move(root);
  }

  void TearDown() override {
    members_.clear();
    etcd_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string File(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

  int Etcdctl(const std::string& user, const std::string& command) {
    const std::string line = absl::StrCat(
        "ETCDCTL_API=3 etcdctl --endpoints=", etcd_->client_url(), " --cacert=", File("ca.crt"),
        " --cert=", File(user + ".crt"), " --key=", File(user + ".key"), " ", command,
        " >/dev/null 2>&1");
    return std::system(line.c_str());
  }

  EtcdOptions EtcdAs(const std::string& user) {
    EtcdOptions options;
    options.endpoints = {etcd_->client_url()};
    options.timeout = absl::Seconds(2);
    options.total_timeout = absl::Seconds(4);
    options.tls_ca = ReadFile(File("ca.crt"));
    options.tls_cert = ReadFile(File(user + ".crt"));
    options.tls_key = ReadFile(File(user + ".key"));
    return options;
  }

  // What a member runs with; `etcd_user` names its etcd client certificate.
  std::vector<std::string> MemberArgs(size_t i, const std::string& etcd_user = "member-etcd") {
    return {"--cluster-etcd=" + etcd_->client_url(),
            absl::StrCat("--cluster-name=", kClusterName),
            absl::StrCat("--cluster-lease-seconds=", kLeaseSeconds),
            "--cluster-etcd-ca=" + File("ca.crt"),
            "--cluster-etcd-cert=" + File(etcd_user + ".crt"),
            "--cluster-etcd-key=" + File(etcd_user + ".key"),
            "--tls-cert=" + File("member.crt"),
            "--tls-key=" + File("member.key"),
            "--tls-client-ca=" + File("ca.crt"),
            "--auth-tokens=" + File("tokens"),
            "--max-memory=200000000",
            "--metrics-listen=127.0.0.1:0",
            absl::StrCat("--metrics-port-file=", File(absl::StrCat("metrics-port", i))),
            "--tls-refresh-seconds=1"};
  }

  absl::StatusOr<std::unique_ptr<DaemonProcess>> Launch(size_t i, std::vector<std::string> args) {
    return DaemonProcess::Start(ROLLPACKD_PATH, std::move(args), File(absl::StrCat("port", i)),
                                absl::Seconds(30));
  }

  void StartThree() {
    for (size_t i = 0; i < 3; ++i) {
      absl::StatusOr<std::unique_ptr<DaemonProcess>> d = Launch(i, MemberArgs(i));
      ASSERT_TRUE(d.ok()) << d.status();
      members_.push_back(*std::move(d));
    }
  }

  // A client presenting `cert` (a name given to MakeTestCertificates) and
  // sending `token` (empty: none).
  ClientOptions As(const std::string& cert, const std::string& token,
                   const std::string& roots = "ca") {
    ClientOptions options;
    options.tls_root_certs_pem = ReadFile(File(roots + ".crt"));
    options.tls_client_cert_pem = ReadFile(File(cert + ".crt"));
    options.tls_client_key_pem = ReadFile(File(cert + ".key"));
    options.auth_token = token;
    return options;
  }
  RollpackClient Client(size_t member, const std::string& cert, const std::string& token) {
    ClientOptions options = As(cert, token);
    return RollpackClient(MakeChannel(members_[member]->address(), options), options);
  }

  // Every member holds 8 samples of pool "pool"; a step over 6 of each.
  void PutSamplesAndCreateStep() {
    ASSERT_TRUE(Client(0, "trainer", kProducerToken).RegisterModel("pool", ClusterModel()).ok());
    for (size_t i = 0; i < 3; ++i) {
      absl::StatusOr<v1::PutSamplesResponse> put = Client(i, "trainer", kProducerToken)
          .PutSamples("pool", ClusterSamples(8, 10 + i, absl::StrCat("m", i, "-")));
      ASSERT_TRUE(put.ok()) << "member " << i << ": " << put.status();
    }
    v1::CreateStepRequest request;
    request.set_step_id("step-t");
    request.set_pool("pool");
    for (const std::string& id : InterleavedIds(6)) request.add_sample_ids(id);
    *request.mutable_topology() = HybridTopology();
    absl::StatusOr<v1::StepInfo> info = Client(1, "trainer", kTrainerToken).CreateStep(request);
    ASSERT_TRUE(info.ok()) << info.status();
  }

  absl::StatusOr<std::vector<std::string>> FetchRank(size_t member, const v1::RankCoords& rank,
                                                     Delivery delivery,
                                                     const ClientOptions& options) {
    TrainerStreamOptions stream_options;
    stream_options.max_resumes = 0;
    stream_options.delivery = delivery;
    stream_options.auth_token = options.auth_token;
    stream_options.member_channel = [options](const std::string& address) {
      return MakeChannel(address, options);
    };
    TrainerStream stream(MakeChannel(members_[member]->address(), options), "step-t", rank,
                         stream_options);
    std::vector<std::string> out;
    while (true) {
      absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
      if (!next.ok()) return next.status();
      if (!next->has_value()) return out;
      out.push_back(DeterministicBytes(**next));
    }
  }

  double Metric(size_t member, const std::string& series) {
    int port = 0;
    std::ifstream(File(absl::StrCat("metrics-port", member))) >> port;
    httplib::Client http("127.0.0.1", port);
    httplib::Result got = http.Get("/metrics");
    if (!got || got->status != 200) return -1;
    std::map<std::string, double> m = ParseExposition(got->body);
    auto it = m.find(series);
    return it == m.end() ? 0 : it->second;
  }

  absl::StatusOr<std::vector<std::string>> FetchRank(size_t member, const v1::RankCoords& rank,
                                                     Delivery delivery) {
    return FetchRank(member, rank, delivery, As("trainer", kTrainerToken));
  }

  std::string dir_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_root_;
  std::vector<std::unique_ptr<DaemonProcess>> members_;
};

TEST_F(ClusterTrustTest, MembersWithCredentialsServeEveryRankInBothModes) {
  StartThree();
  PutSamplesAndCreateStep();
  for (const v1::RankCoords& rank : AllRanks(HybridTopology())) {
    absl::StatusOr<std::vector<std::string>> want = FetchRank(0, rank, Delivery::kProxy);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_FALSE(want->empty());
    for (size_t m = 0; m < 3; ++m) {
      for (Delivery delivery : {Delivery::kProxy, Delivery::kDirect}) {
        absl::StatusOr<std::vector<std::string>> got = FetchRank(m, rank, delivery);
        ASSERT_TRUE(got.ok()) << "member " << m << ": " << got.status();
        EXPECT_EQ(*got, *want) << "member " << m << " rank " << rank.ShortDebugString();
      }
    }
  }
}

TEST_F(ClusterTrustTest, TheMemberServiceAnswersMemberCertificatesOnly) {
  StartThree();
  PutSamplesAndCreateStep();
  // A client certificate of the cluster's CA that is not a member's, with
  // the admin token: refused, from the call's headers.
  ClientOptions trainer = As("trainer", kAdminToken);
  auto stub = v1::Member::NewStub(MakeChannel(members_[0]->address(), trainer));
  auto with_token = [](grpc::ClientContext* context) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", kAdminToken));
  };
  {
    grpc::ClientContext context;
    with_token(&context);
    v1::StepHoldRequest request;
    request.set_step_id("step-t");
    v1::DropHoldResponse response;
    grpc::Status s = stub->ReleaseHold(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("rollpack-member"));
  }
  {
    grpc::ClientContext context;
    with_token(&context);
    v1::HoldSamplesRequest request;
    request.set_step_id("thief");
    request.set_pool("pool");
    request.add_sample_ids("m0-rollout-7");
    v1::HoldSamplesResponse response;
    EXPECT_EQ(stub->HoldSamples(&context, request, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext context;
    with_token(&context);
    v1::DropGroupsRequest request;
    request.set_pool("pool");
    v1::DropGroupsResponse response;
    EXPECT_EQ(stub->DropGroups(&context, request, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext context;
    with_token(&context);
    v1::ReadSamplesRequest request;
    request.set_step_id("step-t");
    request.add_sample_ids("m0-rollout-0");
    auto reader = stub->ReadSamples(&context, request);
    v1::SampleBatch batch;
    EXPECT_FALSE(reader->Read(&batch)) << "a sample was read without a member certificate";
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_GE(Metric(0, "rollpack_calls_refused_at_start_total{code=\"PERMISSION_DENIED\"}"), 4);

  // The member certificate is admitted without a token...
  auto member_stub =
      v1::Member::NewStub(MakeChannel(members_[0]->address(), As("member", "")));
  {
    grpc::ClientContext context;
    v1::ListFreeSamplesRequest request;
    request.set_pool("pool");
    request.set_limit(100);
    v1::FreeSamples response;
    grpc::Status s = member_stub->ListFreeSamples(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.sample_ids_size(), 2);  // m0-rollout-6 and -7 are free
  }
  // ...one with the same name from another CA never gets past TLS.
  auto impostor_stub =
      v1::Member::NewStub(MakeChannel(members_[0]->address(), As("impostor", "")));
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListFreeSamplesRequest request;
    request.set_pool("pool");
    v1::FreeSamples response;
    EXPECT_EQ(impostor_stub->ListFreeSamples(&context, request, &response).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  // Nothing of the step was touched: every rank is still served.
  absl::StatusOr<std::vector<std::string>> fetched =
      FetchRank(2, AllRanks(HybridTopology())[0], Delivery::kProxy);
  EXPECT_TRUE(fetched.ok()) << fetched.status();
}

TEST_F(ClusterTrustTest, DestructiveCallsNeedTheirRolesOnEveryMember) {
  StartThree();
  PutSamplesAndCreateStep();
  for (size_t m = 0; m < 3; ++m) {
    absl::StatusOr<v1::ReleaseStepResponse> anonymous =
        Client(m, "trainer", "").ReleaseStep("step-t");
    EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kUnauthenticated) << m;
    absl::StatusOr<v1::ReleaseStepResponse> trainer =
        Client(m, "trainer", kTrainerToken).ReleaseStep("step-t");
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kPermissionDenied) << m;
    absl::StatusOr<v1::PoolInfo> policy =
        Client(m, "trainer", "").SetPolicyVersion("pool", int64_t{1} << 62);
    EXPECT_EQ(policy.status().code(), absl::StatusCode::kUnauthenticated) << m;
    absl::StatusOr<v1::PoolInfo> producer_policy =
        Client(m, "trainer", kProducerToken).SetPolicyVersion("pool", int64_t{1} << 62);
    EXPECT_EQ(producer_policy.status().code(), absl::StatusCode::kPermissionDenied) << m;
  }
  // The step and the free samples are as they were.
  absl::StatusOr<v1::PoolInfo> pool = Client(0, "trainer", kTrainerToken).GetPool("pool");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->num_samples(), 24);
  EXPECT_EQ(pool->num_free_samples(), 6);
  absl::StatusOr<v1::ReleaseStepResponse> admin =
      Client(2, "trainer", kAdminToken).ReleaseStep("step-t");
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_EQ(admin->released_samples(), 18);
}

TEST_F(ClusterTrustTest, OnlyARollpackdWithCredentialsJoins) {
  StartThree();
  // etcd refuses a certificate whose user has no role on the prefix...
  absl::StatusOr<std::unique_ptr<DaemonProcess>> stranger = Launch(3, MemberArgs(3, "stranger"));
  EXPECT_FALSE(stranger.ok()) << "a member whose etcd user may not touch the prefix joined";
  // ...and a client of another CA at all.
  absl::StatusOr<std::unique_ptr<DaemonProcess>> impostor = Launch(4, MemberArgs(4, "impostor"));
  EXPECT_FALSE(impostor.ok()) << "a member with another CA's etcd certificate joined";
  // Without etcd credentials it cannot even ask.
  std::vector<std::string> no_etcd_credentials = MemberArgs(5);
  no_etcd_credentials.erase(no_etcd_credentials.begin() + 3, no_etcd_credentials.begin() + 6);
  absl::StatusOr<std::unique_ptr<DaemonProcess>> bare = Launch(5, no_etcd_credentials);
  EXPECT_FALSE(bare.ok()) << "a member without etcd credentials joined";
  // A member key exists for the three members only.
  absl::StatusOr<std::vector<EtcdKeyValue>> keys =
      etcd_root_->ListPrefix(absl::StrCat("/", kClusterName, "/members/"));
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->size(), 3u);

  // The member's own etcd user reads nothing outside the cluster's prefix.
  ASSERT_TRUE(etcd_root_->Put("/other-cluster/secret", "x").ok());
  absl::StatusOr<std::unique_ptr<EtcdClient>> as_member = EtcdClient::Create(EtcdAs("member"));
  ASSERT_TRUE(as_member.ok());
  EXPECT_FALSE((*as_member)->Get("/other-cluster/secret").ok());
  EXPECT_TRUE((*as_member)->Get(absl::StrCat("/", kClusterName, "/x")).ok());
}

TEST_F(ClusterTrustTest, LeaselessAndOverwrittenMemberKeysChangeNothing) {
  StartThree();
  PutSamplesAndCreateStep();
  const std::string prefix = absl::StrCat("/", kClusterName, "/members/");
  // A key without a lease naming a member that never answers: it made every
  // CreateStep UNAVAILABLE.
  ASSERT_TRUE(etcd_root_->Put(prefix + "127.0.0.1:9", "127.0.0.1:9\nforged").ok());
  v1::CreateStepRequest request;
  request.set_step_id("after-forgery");
  request.set_pool("pool");
  request.set_num_samples(3);
  *request.mutable_topology() = HybridTopology();
  request.mutable_topology()->set_dp(1);
  request.mutable_topology()->set_pp(1);
  request.mutable_topology()->set_cp(1);
  absl::StatusOr<v1::StepInfo> info = Client(0, "trainer", kTrainerToken).CreateStep(request);
  EXPECT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(Eventually([&] { return Metric(0, "rollpack_cluster_members") == 3; },
                         absl::Seconds(5)));

  // A live member's key overwritten by hand (no lease): the member puts its
  // registration back within a renewal.
  const std::string key0 = prefix + members_[0]->address();
  absl::StatusOr<std::optional<EtcdKeyValue>> before = etcd_root_->GetEntry(key0);
  ASSERT_TRUE(before.ok() && before->has_value());
  ASSERT_TRUE(etcd_root_->Put(key0, "127.0.0.1:9\nhijacked").ok());
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<std::optional<EtcdKeyValue>> now = etcd_root_->GetEntry(key0);
        return now.ok() && now->has_value() && (*now)->value == (*before)->value &&
               (*now)->lease == (*before)->lease;
      },
      absl::Seconds(5)));

  // A stopped member's key replaced by a leaseless one: it locked that
  // member out for good. Its restart now takes the key back.
  const int port = members_[2]->port();
  const std::string address2 = members_[2]->address();
  const std::string key2 = prefix + address2;
  members_[2]->Kill(SIGKILL);
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<std::optional<EtcdKeyValue>> now = etcd_root_->GetEntry(key2);
        return now.ok() && !now->has_value();
      },
      absl::Seconds(10)));
  ASSERT_TRUE(etcd_root_->Put(key2, "127.0.0.1:9\nsquatter").ok());
  std::vector<std::string> args = MemberArgs(2);
  args.push_back(absl::StrCat("--listen=127.0.0.1:", port));
  absl::StatusOr<std::unique_ptr<DaemonProcess>> again = Launch(2, args);
  ASSERT_TRUE(again.ok()) << again.status();
  members_[2] = *std::move(again);
  absl::StatusOr<std::optional<EtcdKeyValue>> taken = etcd_root_->GetEntry(key2);
  ASSERT_TRUE(taken.ok() && taken->has_value());
  EXPECT_NE((*taken)->lease, 0);
  EXPECT_EQ((*taken)->value.substr(0, (*taken)->value.find('\n')), address2);
}

// Issue 36: certificates and tokens rotate without restarting a member:
// the TLS files are re-read (--tls-refresh-seconds), the token file on SIGHUP.
TEST_F(ClusterTrustTest, CertificatesAndTokensRotateWithoutARestart) {
  StartThree();
  PutSamplesAndCreateStep();
  const v1::RankCoords rank = AllRanks(HybridTopology())[0];
  absl::StatusOr<std::vector<std::string>> before = FetchRank(0, rank, Delivery::kProxy);
  ASSERT_TRUE(before.ok()) << before.status();

  // 1. Every member trusts the new CA as well as the old one...
  std::ofstream(File("ca.crt"), std::ios::app) << ReadFile(File("ca2.crt"));
  // 2. ...then presents a certificate of the new CA (the member identity is
  // the same), written as a whole new file, as a secret volume swaps them.
  for (const char* ext : {".key", ".crt"}) {
    std::ofstream(File("member.new")) << ReadFile(File(std::string("member2") + ext));
    std::filesystem::rename(File("member.new"), File(std::string("member") + ext));
  }
  // A client that knows only the new CA reaches every member once they took
  // the new certificate, and the members reach each other with it (a proxied
  // fetch pulls from the other owners). Each member re-reads its files on its
  // own timer, so the fetches start once all of them did: until then a
  // member that still trusts the old CA alone refuses a peer's new
  // certificate, which is what a rotation in two steps is for.
  const ClientOptions fresh = As("trainer2", kTrainerToken, "ca2");
  for (size_t m = 0; m < 3; ++m) {
    ASSERT_TRUE(Eventually(
        [&] {
          ClientOptions options = fresh;
          options.deadline = absl::Seconds(2);
          return RollpackClient(MakeDistinctChannel(members_[m]->address(), options), options)
              .GetPool("pool")
              .ok();
        },
        absl::Seconds(15)))
        << "member " << m << " still presents the old certificate";
  }
  for (size_t m = 0; m < 3; ++m) {
    absl::StatusOr<std::vector<std::string>> after = FetchRank(m, rank, Delivery::kProxy, fresh);
    ASSERT_TRUE(after.ok()) << "member " << m << ": " << after.status();
    EXPECT_EQ(*after, *before) << "member " << m;
  }

  // 3. A new token file, and SIGHUP: the old trainer token is refused, the
  // new one works, on every member; the process is the same.
  const std::string new_trainer = "trainer-token-rotated-987654";
  std::ofstream(File("tokens.new")) << "producer " << kProducerToken << "\ntrainer "
                                    << new_trainer << "\nadmin " << kAdminToken << "\n";
  chmod(File("tokens.new").c_str(), 0600);
  std::filesystem::rename(File("tokens.new"), File("tokens"));
  for (size_t m = 0; m < 3; ++m) {
    const pid_t pid = members_[m]->pid();
    ASSERT_EQ(kill(pid, SIGHUP), 0);
    EXPECT_TRUE(Eventually(
        [&] {
          return Client(m, "trainer", kTrainerToken).GetPool("pool").status().code() ==
                 absl::StatusCode::kUnauthenticated;
        },
        absl::Seconds(5)))
        << "member " << m << " still takes the old token";
    EXPECT_TRUE(Client(m, "trainer", new_trainer).GetPool("pool").ok()) << "member " << m;
    EXPECT_EQ(members_[m]->pid(), pid);
  }
}


// Peak resident bytes of process `pid` (VmHWM), 0 when unreadable.
int64_t PeakRssBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

// A peer's ReadSamples reply larger than this member takes from peers
// (--max-message-bytes + 5 MiB) never makes it hold more than twice that:
// gRPC would refuse an oversize message only once it held all of it (a fake
// member's 1.5 GB reply took a member to 3.05 GB), so the peers' channels
// share a transport quota of twice the bound, past which the reply is reset.
// Here the peer is a real member allowed larger messages, holding one 77 MB
// sample; the member that serves the rank takes 13 MiB messages (a quota of
// 26 MiB).
TEST_F(ClusterFixture, APeersReplyOverTheReceiveBoundIsRefusedNotBuffered) {
  member_args_ = {"--max-message-bytes=268435456", "--max-memory=400000000"};
  StartMember(0);
  member_args_ = {"--max-message-bytes=8388608"};
  StartMember(1);
  v1::ModelSpec model;
  model.set_name("large");
  model.set_num_layers(48);
  model.set_num_experts(128);
  model.set_topk(8);
  ASSERT_TRUE(Client(0).RegisterModel("large", model).ok());
  SyntheticOptions options;
  options.num_samples = 1;
  options.median_length = 200000;
  options.min_length = options.max_length = 200000;
  options.mixed_forms = false;
  options.narrow_when_uniform = true;
  options.token_fields = false;
  std::vector<v1::Sample> sample = MakeSyntheticRollouts(model, options);
  ASSERT_GT(sample[0].ByteSizeLong(), size_t{73} << 20);
  absl::StatusOr<v1::PutSamplesResponse> put = Client(0).PutSamples("large", sample);
  ASSERT_TRUE(put.ok()) << put.status();

  v1::CreateStepRequest create;
  create.set_step_id("step-large");
  create.set_pool("large");
  create.set_num_samples(1);
  create.mutable_topology()->set_dp(1);
  create.mutable_topology()->set_max_tokens_per_rank(262144);
  absl::StatusOr<v1::StepInfo> info = Client(1).CreateStep(create);
  ASSERT_TRUE(info.ok()) << info.status();

  const int64_t peak_before = PeakRssBytes(members_[1]->pid());
  TrainerStreamOptions stream_options;
  stream_options.max_resumes = 0;
  stream_options.delivery = Delivery::kProxy;
  TrainerStream stream(MakeChannel(members_[1]->address()), "step-large", v1::RankCoords(),
                       stream_options);
  absl::StatusOr<std::optional<v1::Microbatch>> first = stream.Next();
  ASSERT_FALSE(first.ok()) << "a 77 MB sample came through a 13 MiB receive bound";
  EXPECT_EQ(first.status().code(), absl::StatusCode::kResourceExhausted) << first.status();
  EXPECT_THAT(std::string(first.status().message()),
              ::testing::HasSubstr(members_[0]->address()))
      << "the refusal names the peer: " << first.status();
  // At most the quota (26 MiB) and some slack was held to refuse it.
  const int64_t peak_after = PeakRssBytes(members_[1]->pid());
  EXPECT_LT(peak_after - peak_before, int64_t{34} << 20)
      << "peak RSS " << peak_before << " -> " << peak_after;
  // The member that refused goes on serving.
  EXPECT_TRUE(Client(1).GetPool("large").ok());
}

}  // namespace
}  // namespace rollpack
