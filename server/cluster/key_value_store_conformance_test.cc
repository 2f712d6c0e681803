// The rules of key_value_store.h, checked on the in-memory fake the
// cluster's unit tests run on and on a real etcd (testing/etcd_process.h)
// through EtcdClient: what the fake answers, etcd answers. Then what only
// the fake does (time, lease expiry and outages by hand).
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd_client.h"
#include "server/cluster/key_value_store.h"
#include "testing/etcd_process.h"
#include "testing/in_memory_key_value_store.h"

namespace rollpack {
namespace {

enum class Backend { kInMemory, kEtcd };

class ClusterKeyValueStoreConformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kInMemory) {
      store_ = InMemoryEtcd::Create()->NewClient();
      return;
    }
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start();
    if (!etcd.ok()) etcd = EtcdProcess::Start();  // a port taken in between
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    EtcdOptions options;
    options.endpoints = {etcd_->client_url()};
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    store_ = *std::move(client);
  }

  // The store's revision now (a listing's snapshot revision).
  int64_t Revision() {
    int64_t revision = 0;
    EXPECT_TRUE(store_->ListPrefix("/none/", &revision).ok());
    return revision;
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<KeyValueStore> store_;
};

TEST_P(ClusterKeyValueStoreConformance, RevisionsStrictlyIncreaseAndTellValuesApart) {
  const int64_t start = Revision();
  EXPECT_GE(start, 1);
  EXPECT_EQ(Revision(), start) << "a read commits no revision";
  ASSERT_TRUE(store_->Put("/t/a", "1").ok());
  absl::StatusOr<KeyRevisions> first = store_->Revisions("/t/a");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->create, start + 1);
  EXPECT_EQ(first->mod, start + 1);

  ASSERT_TRUE(store_->Put("/t/a", "1").ok());  // the same value: still a new revision
  absl::StatusOr<KeyRevisions> second = store_->Revisions("/t/a");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->create, first->create);
  EXPECT_EQ(second->mod, start + 2);

  ASSERT_TRUE(store_->Delete("/t/a").ok());
  EXPECT_EQ(*store_->CreateRevision("/t/a"), 0);
  EXPECT_EQ(*store_->ModRevision("/t/a"), 0);
  ASSERT_TRUE(store_->Put("/t/a", "1").ok());
  EXPECT_EQ(*store_->CreateRevision("/t/a"), start + 4) << "created again: a new create revision";

  // Deleting what is not there changes nothing.
  const int64_t before = Revision();
  ASSERT_TRUE(store_->Delete("/t/none").ok());
  EXPECT_EQ(Revision(), before);

  absl::StatusOr<std::optional<EtcdKeyValue>> entry = store_->GetEntry("/t/a");
  ASSERT_TRUE(entry.ok());
  ASSERT_TRUE(entry->has_value());
  EXPECT_EQ((*entry)->value, "1");
  EXPECT_EQ((*entry)->lease, 0);
  EXPECT_EQ((*entry)->mod_revision, start + 4);
  EXPECT_FALSE(store_->GetEntry("/t/none")->has_value());
  EXPECT_FALSE(store_->Get("/t/none")->has_value());
}

TEST_P(ClusterKeyValueStoreConformance, ListingsAreOnePrefixInKeyOrder) {
  for (const char* key : {"/p/b", "/p/a", "/p0", "/q", "/p/\xff"}) {
    ASSERT_TRUE(store_->Put(key, absl::StrCat("v", key)).ok());
  }
  int64_t revision = 0;
  absl::StatusOr<std::vector<EtcdKeyValue>> listed = store_->ListPrefix("/p/", &revision);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[0].key, "/p/a");
  EXPECT_EQ((*listed)[1].key, "/p/b");
  EXPECT_EQ((*listed)[2].key, "/p/\xff");
  EXPECT_EQ((*listed)[0].value, "v/p/a");
  EXPECT_EQ(revision, Revision());
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> keys =
      store_->ListPrefixKeys("/p/");
  ASSERT_TRUE(keys.ok());
  ASSERT_EQ(keys->size(), 3u);
  for (size_t i = 0; i < keys->size(); ++i) {
    EXPECT_EQ((*keys)[i].first, (*listed)[i].key);
    EXPECT_EQ((*keys)[i].second, (*listed)[i].mod_revision);
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> pairs =
      store_->GetPrefix("/p");
  ASSERT_TRUE(pairs.ok());
  EXPECT_EQ(pairs->size(), 4u);  // "/p0" too
}

TEST_P(ClusterKeyValueStoreConformance, RacingCreatorsExactlyOneWinsAndAllSeeItsValue) {
  std::atomic<int> created{0};
  std::vector<std::string> seen(8);
  std::vector<int64_t> revisions(8);
  std::vector<std::thread> racers;
  for (int i = 0; i < 8; ++i) {
    racers.emplace_back([&, i] {
      bool mine = false;
      absl::StatusOr<std::string> held = store_->CreateIfAbsent(
          "/t/race", absl::StrCat("v", i), &mine, /*lease=*/0, &revisions[i]);
      if (held.ok()) seen[i] = *held;
      if (mine) ++created;
    });
  }
  for (std::thread& t : racers) t.join();
  EXPECT_EQ(created.load(), 1);
  const int64_t mod = *store_->ModRevision("/t/race");
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(seen[i], seen[0]);
    EXPECT_EQ(revisions[i], mod);
  }
  EXPECT_EQ(*store_->Get("/t/race"), seen[0]);
}

TEST_P(ClusterKeyValueStoreConformance, ReplaceIfUnchangedComparesTheModRevision) {
  // Absent compares as revision 0.
  EXPECT_FALSE(*store_->ReplaceIfUnchanged("/t/k", 5, "x"));
  EXPECT_FALSE(store_->Get("/t/k")->has_value());
  ASSERT_TRUE(*store_->ReplaceIfUnchanged("/t/k", 0, "a"));
  const int64_t seen = *store_->ModRevision("/t/k");
  ASSERT_TRUE(store_->Put("/t/k", "b").ok());  // another writer
  const int64_t before = Revision();
  EXPECT_FALSE(*store_->ReplaceIfUnchanged("/t/k", seen, "c"));
  EXPECT_EQ(Revision(), before) << "a failed compare writes nothing";
  EXPECT_EQ(**store_->Get("/t/k"), "b");
  EXPECT_TRUE(*store_->ReplaceIfUnchanged("/t/k", *store_->ModRevision("/t/k"), "c"));
  EXPECT_EQ(**store_->Get("/t/k"), "c");
}

TEST_P(ClusterKeyValueStoreConformance, DeleteAllIsOneTransaction) {
  ASSERT_TRUE(store_->Put("/d/a", "1").ok());
  ASSERT_TRUE(store_->Put("/d/b", "2").ok());
  const int64_t before = Revision();
  absl::StatusOr<int64_t> deleted = store_->DeleteAll({"/d/a", "/d/b", "/d/none"});
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 2);
  EXPECT_EQ(Revision(), before + 1);
  EXPECT_TRUE(store_->GetPrefix("/d/")->empty());
  EXPECT_EQ(*store_->DeleteAll({"/d/a"}), 0);
  EXPECT_EQ(Revision(), before + 1);
}

TEST_P(ClusterKeyValueStoreConformance, ALeaseTakesItsKeysWithItAtOneRevision) {
  absl::StatusOr<int64_t> lease = store_->GrantLease(absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_NE(*lease, 0);
  ASSERT_TRUE(store_->Put("/l/a", "1", *lease).ok());
  bool created = false;
  ASSERT_TRUE(store_->CreateIfAbsent("/l/b", "2", &created, *lease).ok());
  ASSERT_TRUE(created);
  ASSERT_TRUE(store_->Put("/l/c", "3").ok());
  EXPECT_EQ((*store_->GetEntry("/l/a"))->lease, *lease);
  EXPECT_TRUE(store_->KeepAlive(*lease).ok());

  const int64_t before = Revision();
  ASSERT_TRUE(store_->RevokeLease(*lease).ok());
  EXPECT_EQ(Revision(), before + 1);
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> left = store_->GetPrefix("/l/");
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ((*left)[0].first, "/l/c");

  // Gone: a renewal is NOT_FOUND (how a member learns it lost its
  // membership), a put on it fails and writes nothing.
  EXPECT_TRUE(absl::IsNotFound(store_->KeepAlive(*lease))) << store_->KeepAlive(*lease);
  absl::Status put = store_->Put("/l/d", "4", *lease);
  EXPECT_TRUE(absl::IsUnavailable(put)) << put;
  EXPECT_FALSE(store_->Get("/l/d")->has_value());
  EXPECT_FALSE(store_->CreateIfAbsent("/l/d", "4", &created, *lease).ok());
  EXPECT_FALSE(store_->Get("/l/d")->has_value());
  EXPECT_FALSE(store_->RevokeLease(*lease).ok());
  EXPECT_TRUE(store_->reachable()) << "a refusal is etcd answering";
}

TEST_P(ClusterKeyValueStoreConformance, APutMovesAKeyBetweenLeases) {
  absl::StatusOr<int64_t> first = store_->GrantLease(absl::Seconds(30));
  absl::StatusOr<int64_t> second = store_->GrantLease(absl::Seconds(30));
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(store_->Put("/m/a", "1", *first).ok());
  ASSERT_TRUE(store_->Put("/m/a", "2", *second).ok());
  ASSERT_TRUE(store_->RevokeLease(*first).ok());
  EXPECT_EQ(**store_->Get("/m/a"), "2");
  ASSERT_TRUE(store_->Put("/m/a", "3").ok());  // detached from any lease
  ASSERT_TRUE(store_->RevokeLease(*second).ok());
  EXPECT_EQ(**store_->Get("/m/a"), "3");
}

INSTANTIATE_TEST_SUITE_P(Backends, ClusterKeyValueStoreConformance,
                         ::testing::Values(Backend::kInMemory, Backend::kEtcd),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param == Backend::kInMemory ? "InMemory" : "Etcd";
                         });

// What only the fake does: time, lease expiry and outages by hand.

TEST(ClusterInMemoryEtcd, LeasesRunOutByTheClockUnlessKeptAlive) {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::shared_ptr<InMemoryEtcd> etcd = InMemoryEtcd::Create([&now] { return now; });
  std::unique_ptr<KeyValueStore> store = etcd->NewClient();
  const int64_t kept = *store->GrantLease(absl::Seconds(5));
  const int64_t left = *store->GrantLease(absl::Seconds(5));
  ASSERT_TRUE(store->Put("/k/kept", "1", kept).ok());
  ASSERT_TRUE(store->Put("/k/left", "1", left).ok());
  now += absl::Seconds(4);
  ASSERT_TRUE(store->KeepAlive(kept).ok());
  now += absl::Seconds(2);  // `left` ran out; `kept` has 3 s to go
  EXPECT_FALSE(store->Get("/k/left")->has_value());
  EXPECT_TRUE(absl::IsNotFound(store->KeepAlive(left)));
  EXPECT_TRUE(store->Get("/k/kept")->has_value());
  EXPECT_EQ(etcd->leases(), std::vector<int64_t>{kept});
  ASSERT_TRUE(etcd->ExpireLease(kept).ok());
  EXPECT_FALSE(store->Get("/k/kept")->has_value());
  EXPECT_TRUE(absl::IsNotFound(store->KeepAlive(kept)));
  EXPECT_TRUE(absl::IsNotFound(etcd->ExpireLease(kept)));
}

TEST(ClusterInMemoryEtcd, AnOutageFailsEveryCallAndIsSeenOnceEachWay) {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::shared_ptr<InMemoryEtcd> etcd = InMemoryEtcd::Create([&now] { return now; });
  std::unique_ptr<KeyValueStore> store = etcd->NewClient(/*grace=*/absl::Seconds(3));
  std::vector<bool> changes;
  store->SetReachabilityListener([&changes](bool reachable) { changes.push_back(reachable); });
  ASSERT_TRUE(store->Put("/o/a", "1").ok());
  const int64_t lease = *store->GrantLease(absl::Seconds(5));
  const int64_t revision = etcd->revision();

  etcd->StartOutage(absl::Seconds(10));
  absl::Status put = store->Put("/o/b", "1");
  EXPECT_TRUE(absl::IsUnavailable(put)) << put;
  EXPECT_NE(put.message().find("put /o/b"), std::string::npos) << put;
  EXPECT_TRUE(store->reachable()) << "one failed call within the grace is no outage";
  EXPECT_EQ(store->last_trouble(), now);
  now += absl::Seconds(3);
  EXPECT_TRUE(absl::IsUnavailable(store->Get("/o/a").status()));
  EXPECT_FALSE(store->reachable());
  EXPECT_FALSE(store->Probe(absl::Seconds(1)));
  EXPECT_EQ(changes, std::vector<bool>{false});
  EXPECT_EQ(etcd->revision(), revision) << "nothing is written while etcd is away";

  now += absl::Seconds(7);  // the outage is over; the lease ran out meanwhile
  EXPECT_TRUE(absl::IsNotFound(store->KeepAlive(lease)));
  EXPECT_TRUE(store->reachable());
  EXPECT_EQ(changes, (std::vector<bool>{false, true}));
  EXPECT_EQ(store->reachability().state().outages, 1);
  EXPECT_FALSE(store->Get("/o/b")->has_value());
  EXPECT_EQ(**store->Get("/o/a"), "1");

  etcd->StartOutage();
  EXPECT_FALSE(store->Probe(absl::Seconds(1)));
  etcd->EndOutage();
  EXPECT_TRUE(store->Probe(absl::Seconds(1)));
}

}  // namespace
}  // namespace rollpack
