// sluice-operator against the lab's apiserver (real HTTPS, real Lease and Node writes with
// resourceVersion preconditions), two replicas with short leases: one leads and gives every Node
// a distinct CIDR, the leader crashes (does not release) and the other takes over within the lease
// duration keeping every allocation, a full pool is a counted status, a deleted Node's CIDR goes
// to the next Node; and a leader cut off from the apiserver steps down.
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/k8s/http_client.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/store/object_store.h"
#include "agent/metrics/http_server.h"
#include "agent/metrics/registry.h"
#include "agent/operator/endpoints.h"
#include "agent/operator/operator.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "support/eventually.h"

namespace sluice::agent {
namespace {

using nlohmann::json;
using State = LeaderElector::State;
using ::sluice::testing::Eventually;

constexpr absl::Duration kLease = absl::Seconds(2);  // leaseDurationSeconds is whole seconds
constexpr absl::Duration kRenewDeadline = absl::Milliseconds(1200);
constexpr absl::Duration kRetry = absl::Milliseconds(200);

class OperatorLabTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lab::ApiServerOptions o;
    o.run_controllers = false;  // no lab node IPAM: the operator is the only allocator
    server_ = std::make_unique<lab::ApiServer>(o);
    ASSERT_TRUE(server_->Start().ok());
  }

  std::unique_ptr<k8s::HttpClient> Client() {
    k8s::ClientConfig cfg;
    cfg.server = server_->url();
    cfg.ca_pem = server_->ca_cert_pem();
    cfg.token = server_->token();
    return std::make_unique<k8s::HttpClient>(cfg);
  }

  OperatorOptions Options(const std::string& identity, const std::string& pool_cidr) {
    OperatorOptions o;
    auto pool = ClusterPool::Make({*IpPrefix::Parse(pool_cidr)}, 24);
    EXPECT_TRUE(pool.ok()) << pool.status();
    o.pool = *pool;
    o.election.identity = identity;
    o.election.lease_duration = kLease;
    o.election.renew_deadline = kRenewDeadline;
    o.election.retry_period = kRetry;
    o.lease_namespace = "kube-system";
    o.lease_name = "sluice-operator";
    return o;
  }

  void AddNode(const std::string& name) {
    auto s = server_->store().Create(lab::Resource("nodes"), {{"metadata", {{"name", name}}}});
    ASSERT_TRUE(s.ok()) << s.status();
  }
  void DeleteNode(const std::string& name) {
    auto s = server_->store().Delete(lab::Resource("nodes"), "", name, {});
    ASSERT_TRUE(s.ok()) << s.status();
  }
  // node -> spec.podCIDR ("" when none); checks podCIDRs agrees.
  std::map<std::string, std::string> PodCidrs() {
    std::map<std::string, std::string> out;
    auto list = server_->store().List(lab::Resource("nodes"), {});
    EXPECT_TRUE(list.ok());
    for (const auto& n : list->items) {
      const json spec = n->value("spec", json::object());
      std::string cidr = spec.value("podCIDR", "");
      if (!cidr.empty()) {
        EXPECT_EQ(spec.value("podCIDRs", json::array()), json::array({cidr}));
      }
      out[(*n)["metadata"]["name"].get<std::string>()] = cidr;
    }
    return out;
  }
  std::string LeaseHolder() {
    auto l = server_->store().Get(*lab::FindResource("coordination.k8s.io", "v1", "leases"),
                                  "kube-system", "sluice-operator");
    if (!l.ok()) return "";
    return (*l)["spec"].value("holderIdentity", "");
  }
  static bool AllDistinctAndSet(const std::map<std::string, std::string>& cidrs) {
    std::set<std::string> seen;
    for (const auto& [node, cidr] : cidrs) {
      if (cidr.empty() || !seen.insert(cidr).second) return false;
    }
    return true;
  }

  std::unique_ptr<lab::ApiServer> server_;
};

TEST_F(OperatorLabTest, OneLeadsFailoverKeepsAllocationsExhaustionIsCountedDeletedCidrIsReused) {
  for (const char* n : {"node-a", "node-b", "node-c"}) AddNode(n);
  auto http_a = Client();
  auto http_b = Client();
  // 10.11.0.0/22 holds four /24s.
  auto a = std::make_unique<Operator>(http_a.get(), Options("op-a", "10.11.0.0/22"));
  Operator b(http_b.get(), Options("op-b", "10.11.0.0/22"));
  a->Start();
  b.Start();

  ASSERT_TRUE(Eventually([&] { return a->leading() != b.leading(); }));
  ASSERT_TRUE(Eventually([&] { return AllDistinctAndSet(PodCidrs()); })) << PodCidrs().size();
  const bool a_led = a->leading();
  Operator& leader = a_led ? *a : b;
  Operator& follower = a_led ? b : *a;
  EXPECT_EQ(LeaseHolder(), a_led ? "op-a" : "op-b");
  EXPECT_FALSE(follower.leading());
  EXPECT_EQ(follower.counters().rounds, 0u);  // a follower never allocates
  const std::map<std::string, std::string> before = PodCidrs();
  for (const auto& [node, cidr] : before) {
    EXPECT_TRUE(IpPrefix::Parse("10.11.0.0/22")->Contains(IpPrefix::Parse(cidr)->network()))
        << node << " " << cidr;
  }

  // The leader crashes: it stops without releasing the Lease.
  const absl::Time crashed = absl::Now();
  leader.Stop(/*release=*/false);
  ASSERT_TRUE(Eventually([&] { return follower.leading(); }, kLease + absl::Seconds(3)));
  const absl::Duration takeover = absl::Now() - crashed;
  // Not before the Lease expired (the follower waits out the crashed leader's last renewal, which
  // it may have seen up to a retry period before the crash), and within the lease duration of
  // the last renewal plus the follower's tick (and slack for HTTP on a loaded machine).
  EXPECT_GE(takeover, kLease - 2 * kRetry) << takeover;
  EXPECT_LE(takeover, kLease + 2 * kRetry + absl::Milliseconds(800)) << takeover;
  EXPECT_EQ(LeaseHolder(), a_led ? "op-b" : "op-a");
  EXPECT_TRUE(Eventually([&] { return follower.counters().rounds > 0; }));
  EXPECT_EQ(PodCidrs(), before);  // nothing reallocated
  EXPECT_EQ(follower.counters().patched, 0u);

  // A new node gets the last free /24; one more finds the pool full.
  AddNode("node-d");
  ASSERT_TRUE(Eventually([&] { return AllDistinctAndSet(PodCidrs()); }));
  AddNode("node-e");
  ASSERT_TRUE(Eventually([&] { return follower.counters().exhausted_nodes == 1; }));
  EXPECT_EQ(PodCidrs()["node-e"], "");
  EXPECT_EQ(follower.counters().free_cidrs, 0u);
  EXPECT_TRUE(follower.leading());  // a status, not a crash

  // node-b goes away: its CIDR is free and node-e gets it.
  const std::string freed = PodCidrs()["node-b"];
  DeleteNode("node-b");
  ASSERT_TRUE(Eventually([&] { return PodCidrs()["node-e"] == freed; })) << freed;
  EXPECT_TRUE(AllDistinctAndSet(PodCidrs()));
  EXPECT_TRUE(Eventually([&] { return follower.counters().exhausted_nodes == 0; }));
  for (const auto& [node, cidr] : before) {
    if (node != "node-b") EXPECT_EQ(PodCidrs()[node], cidr) << node;
  }
  follower.Stop();
  EXPECT_EQ(LeaseHolder(), "");  // released on a clean stop
}

TEST_F(OperatorLabTest, LeaderThatCannotRenewStepsDownWithinTheRenewDeadline) {
  auto http = Client();
  Operator op(http.get(), Options("op-a", "10.11.0.0/16"));
  op.Start();
  ASSERT_TRUE(Eventually([&] { return op.leading(); }));
  server_->GoAway();  // connections refused
  const absl::Time cut = absl::Now();
  EXPECT_EQ(op.Wait(), State::kLost);
  const absl::Duration took = absl::Now() - cut;
  EXPECT_GE(took, kRenewDeadline - 2 * kRetry) << took;
  EXPECT_LE(took, kRenewDeadline + absl::Seconds(2)) << took;
  EXPECT_FALSE(op.leading());
  ASSERT_TRUE(server_->ComeBack().ok());
}

// What one replica's Deployment probes and Prometheus see: /healthz, /readyz and /metrics served
// over real HTTP by the routes sluice-operator's main serves.
struct Endpoints {
  explicit Endpoints(const Operator& op) {
    AddOperatorCollector(op, registry);
    std::vector<metrics::Route> routes = OperatorHealthRoutes(op);
    routes.push_back(metrics::MetricsRoute(registry));
    auto s = metrics::HttpServer::Start("127.0.0.1:0", std::move(routes));
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) server = std::move(*s);
  }
  // "<status> <body>" of a GET.
  std::string Get(const std::string& path) {
    httplib::Client c("127.0.0.1", server ? server->port() : 1);
    auto r = c.Get(path);
    if (!r) return "no answer";
    return absl::StrCat(r->status, " ", r->body);
  }
  // The sample `name` (no labels) of /metrics, or "absent".
  std::string Metric(const std::string& name) {
    std::string body = Get("/metrics");
    size_t at = body.find("\n" + name + " ");
    if (at == std::string::npos) return "absent";
    at += name.size() + 2;
    return body.substr(at, body.find('\n', at) - at);
  }
  metrics::Registry registry;
  std::unique_ptr<metrics::HttpServer> server;
};

TEST_F(OperatorLabTest, ProbesAndMetricsTellLeaderFollowerPoolAndExhaustion) {
  for (const char* n : {"node-a", "node-b", "node-c"}) AddNode(n);
  auto http_a = Client();
  auto http_b = Client();
  // 10.11.0.0/22 holds four /24s.
  Operator a(http_a.get(), Options("op-a", "10.11.0.0/22"));
  Operator b(http_b.get(), Options("op-b", "10.11.0.0/22"));
  Endpoints ea(a), eb(b);
  a.Start();
  b.Start();
  ASSERT_TRUE(Eventually([&] { return a.leading() != b.leading(); }));
  Endpoints& leader = a.leading() ? ea : eb;
  Endpoints& follower = a.leading() ? eb : ea;
  ASSERT_TRUE(Eventually([&] { return leader.Metric("sluice_operator_free_node_cidrs") == "1"; }))
      << leader.Get("/metrics");

  EXPECT_EQ(leader.Get("/healthz"), "200 ok election\n");
  EXPECT_EQ(follower.Get("/healthz"), "200 ok election\n");
  EXPECT_EQ(leader.Get("/readyz"), "200 ok election: leading\nok allocation\n");
  EXPECT_EQ(follower.Get("/readyz"), "200 ok election: following\n");
  EXPECT_EQ(leader.Metric("sluice_operator_leader"), "1");
  EXPECT_EQ(follower.Metric("sluice_operator_leader"), "0");
  EXPECT_EQ(leader.Metric("sluice_operator_node_cidrs_allocated_total"), "3");
  EXPECT_EQ(leader.Metric("sluice_operator_nodes_without_cidr"), "0");
  EXPECT_EQ(follower.Metric("sluice_operator_allocation_rounds_total"), "0");
  // A follower has not looked at the pool: it says nothing about it.
  EXPECT_EQ(follower.Metric("sluice_operator_free_node_cidrs"), "absent");

  // Two more nodes: the last /24 goes, and one node is left without: exhaustion is a gauge.
  AddNode("node-d");
  AddNode("node-e");
  ASSERT_TRUE(Eventually([&] {
    return leader.Metric("sluice_operator_nodes_without_cidr") == "1";
  })) << leader.Get("/metrics");
  EXPECT_EQ(leader.Metric("sluice_operator_free_node_cidrs"), "0");
  EXPECT_EQ(leader.Get("/readyz"), "200 ok election: leading\nok allocation\n");

  // An ended election (the binary exits then) fails liveness.
  Operator& stopped = a.leading() ? a : b;
  Endpoints& stopped_endpoints = a.leading() ? ea : eb;
  stopped.Stop();
  EXPECT_EQ(stopped_endpoints.Get("/healthz"), "503 fail election: ended\n");
  EXPECT_EQ(stopped_endpoints.Metric("sluice_operator_leader"), "0");
}

}  // namespace
}  // namespace sluice::agent
