// TranslatePolicy with a TranslationCache against the same translation without one: random
// sequences of the changes a cluster sees (pods created, deleted, relabelled, moved between
// addresses, their named ports changed; namespaces relabelled; policies created, updated, deleted,
// some with bad input; local endpoints coming and going; objects written again unchanged as new
// objects), and after every change the cached result equals a full re-translation: ipcache,
// every endpoint's entries, the problems, and the numbering of the identities.
#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/policy/translator.h"
#include "gtest/gtest.h"

namespace sluice::agent {
namespace {

class World {
 public:
  explicit World(uint32_t seed) : rng_(seed) {
    in_.node_name = "n1";
    in_.nodes = {Node("n1", "192.168.1.1", "10.1.1.0/24"), Node("n2", "192.168.1.2", "10.1.2.0/24")};
    for (int i = 0; i < 4; ++i) in_.namespaces.push_back(RandomNs(absl::StrCat("ns", i)));
    for (int i = 0; i < 16; ++i) AddPod();
    for (int i = 0; i < 6; ++i) AddPolicy();
  }

  const PolicyInput& input() const { return in_; }

  // One random change; returns what it was (for failure messages).
  std::string Change() {
    switch (Pick(12)) {
      case 0:
        return AddPod();
      case 1: {
        if (in_.pods.empty()) return "none";
        size_t i = Pick(in_.pods.size());
        std::string key = in_.pods[i]->meta.Key();
        in_.pods.erase(in_.pods.begin() + i);
        return "delete pod " + key;
      }
      case 2:
      case 3: {
        if (in_.pods.empty()) return "none";
        size_t i = Pick(in_.pods.size());
        auto p = std::make_shared<k8s::Pod>(*in_.pods[i]);
        p->meta.labels = RandomPodLabels();
        in_.pods[i] = p;
        return "relabel pod " + p->meta.Key();
      }
      case 4: {
        if (in_.pods.empty()) return "none";
        size_t i = Pick(in_.pods.size());
        auto p = std::make_shared<k8s::Pod>(*in_.pods[i]);
        switch (Pick(4)) {
          case 0: p->container_ports = RandomPorts(); break;
          case 1: p->meta.deleting = !p->meta.deleting; break;
          case 2: p->pod_ips = {RandomIp(p->node_name)}; break;
          default: p->phase = p->phase == "Running" ? "Succeeded" : "Running"; break;
        }
        in_.pods[i] = p;
        return "modify pod " + p->meta.Key();
      }
      case 5: {
        size_t i = Pick(in_.namespaces.size());
        in_.namespaces[i] = RandomNs(in_.namespaces[i]->meta.name);
        return "relabel namespace " + in_.namespaces[i]->meta.name;
      }
      case 6:
        return AddPolicy();
      case 7: {
        if (in_.policies.empty()) return "none";
        size_t i = Pick(in_.policies.size());
        in_.policies[i] = RandomPolicy(in_.policies[i]->meta.namespace_, in_.policies[i]->meta.name);
        return "update policy " + in_.policies[i]->meta.Key();
      }
      case 8: {
        if (in_.policies.empty()) return "none";
        size_t i = Pick(in_.policies.size());
        std::string key = in_.policies[i]->meta.Key();
        in_.policies.erase(in_.policies.begin() + i);
        return "delete policy " + key;
      }
      case 9: {
        // Endpoints: one more (of a pod of this node, or of no pod at all) or one fewer.
        if (!in_.endpoints.empty() && Pick(2) == 0) {
          size_t i = Pick(in_.endpoints.size());
          uint32_t id = in_.endpoints[i].endpoint_id;
          in_.endpoints.erase(in_.endpoints.begin() + i);
          return absl::StrCat("remove endpoint ", id);
        }
        PolicyEndpoint ep;
        ep.endpoint_id = next_ep_++;
        if (in_.pods.empty() || Pick(5) == 0) {
          ep.pod_namespace = "ns0";
          ep.pod_name = absl::StrCat("ghost", ep.endpoint_id);
          ep.address = *IpAddress::Parse(RandomIp("n1"));
        } else {
          const auto& p = in_.pods[Pick(in_.pods.size())];
          ep.pod_namespace = p->meta.namespace_;
          ep.pod_name = p->meta.name;
          ep.address = *IpAddress::Parse(p->pod_ips.empty() ? RandomIp("n1") : p->pod_ips[0]);
        }
        in_.endpoints.push_back(ep);
        return absl::StrCat("add endpoint ", ep.endpoint_id);
      }
      case 10: {
        // Written again unchanged: a new object with the same content.
        switch (Pick(3)) {
          case 0:
            if (!in_.pods.empty()) {
              // Or with status churn only: what the translator does not read.
              size_t i = Pick(in_.pods.size());
              auto p = std::make_shared<k8s::Pod>(*in_.pods[i]);
              if (Pick(2) == 0) {
                p->ready = !p->ready;
                p->host_ip = absl::StrCat("192.168.0.", Pick(250));
                p->meta.resource_version = absl::StrCat(Pick(100000));
                if (p->phase == "Running" || p->phase == "Pending") {
                  p->phase = p->phase == "Running" ? "Pending" : "Running";
                }
              }
              in_.pods[i] = p;
            }
            break;
          case 1: {
            size_t i = Pick(in_.namespaces.size());
            in_.namespaces[i] = std::make_shared<k8s::Namespace>(*in_.namespaces[i]);
            break;
          }
          default:
            if (!in_.policies.empty()) {
              size_t i = Pick(in_.policies.size());
              in_.policies[i] = std::make_shared<k8s::NetworkPolicy>(*in_.policies[i]);
            }
        }
        return "rewrite unchanged";
      }
      default:
        // The stores list in no promised order.
        std::shuffle(in_.pods.begin(), in_.pods.end(), rng_);
        std::shuffle(in_.policies.begin(), in_.policies.end(), rng_);
        return "reorder";
    }
  }

 private:
  size_t Pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  template <typename T>
  const T& OneOf(const std::vector<T>& v) { return v[Pick(v.size())]; }

  static std::shared_ptr<const k8s::Node> Node(std::string name, std::string ip, std::string cidr) {
    auto n = std::make_shared<k8s::Node>();
    n->meta.name = std::move(name);
    n->internal_ips = {std::move(ip)};
    n->pod_cidrs = {std::move(cidr)};
    return n;
  }

  std::shared_ptr<const k8s::Namespace> RandomNs(const std::string& name) {
    auto n = std::make_shared<k8s::Namespace>();
    n->meta.name = name;
    if (Pick(4) != 0) n->meta.labels["team"] = OneOf<std::string>({"a", "b", "c"});
    if (Pick(2) == 0) n->meta.labels["env"] = OneOf<std::string>({"p", "q"});
    if (Pick(3) != 0) n->meta.labels[std::string(k8s::kLabelNamespaceName)] = name;
    return n;
  }

  k8s::StringMap RandomPodLabels() {
    k8s::StringMap l;
    if (Pick(5) != 0) l["app"] = OneOf<std::string>({"a", "b", "c"});
    if (Pick(2) == 0) l["role"] = OneOf<std::string>({"x", "y"});
    return l;
  }

  std::vector<k8s::ContainerPort> RandomPorts() {
    std::vector<k8s::ContainerPort> out;
    if (Pick(2) == 0) out.push_back({"http", Pick(2) == 0 ? 80 : 8080, k8s::Protocol::kTCP});
    if (Pick(2) == 0) out.push_back({"dns", 53, k8s::Protocol::kUDP});
    if (Pick(4) == 0) out.push_back({"http", 81, k8s::Protocol::kUDP});
    return out;
  }

  // Few addresses, so that pods sometimes claim the same one.
  std::string RandomIp(const std::string& node) {
    return absl::StrCat(node == "n1" ? "10.1.1." : "10.1.2.", 1 + Pick(24));
  }

  std::string AddPod() {
    auto p = std::make_shared<k8s::Pod>();
    p->meta.namespace_ = absl::StrCat("ns", Pick(4));
    p->meta.name = absl::StrCat("p", next_pod_++);
    p->meta.labels = RandomPodLabels();
    p->node_name = Pick(2) == 0 ? "n1" : "n2";
    p->pod_ips = {RandomIp(p->node_name)};
    p->phase = "Running";
    p->host_network = Pick(20) == 0;
    p->container_ports = RandomPorts();
    in_.pods.push_back(p);
    if (p->node_name == "n1" && !p->host_network && Pick(4) != 0) {
      in_.endpoints.push_back(
          {next_ep_++, p->meta.namespace_, p->meta.name, *IpAddress::Parse(p->pod_ips[0])});
    }
    return "add pod " + p->meta.Key();
  }

  k8s::LabelSelector RandomSelector(bool pod) {
    k8s::LabelSelector s;
    switch (Pick(6)) {
      case 0: break;  // everything
      case 1:
      case 2:
        if (pod) {
          s.match_labels["app"] = OneOf<std::string>({"a", "b", "c"});
        } else {
          s.match_labels["team"] = OneOf<std::string>({"a", "b", "c"});
        }
        break;
      case 3:
        s.match_expressions.push_back(
            {pod ? "role" : "env", OneOf<std::string>({"In", "NotIn"}), {"x", "p"}});
        break;
      case 4:
        s.match_expressions.push_back(
            {pod ? "app" : "team", OneOf<std::string>({"Exists", "DoesNotExist"}), {}});
        break;
      default:
        if (Pick(3) == 0) {
          s.match_expressions.push_back({"app", "Bogus", {}});  // rejected
        } else {
          s.match_labels[std::string(k8s::kLabelNamespaceName)] = absl::StrCat("ns", Pick(4));
        }
    }
    return s;
  }

  k8s::NetworkPolicyPeer RandomPeer() {
    k8s::NetworkPolicyPeer p;
    switch (Pick(5)) {
      case 0: p.pod_selector = RandomSelector(true); break;
      case 1: p.namespace_selector = RandomSelector(false); break;
      case 2:
        p.pod_selector = RandomSelector(true);
        p.namespace_selector = RandomSelector(false);
        break;
      case 3: {
        k8s::IpBlock b;
        b.cidr = OneOf<std::string>({"10.1.0.0/16", "10.1.1.0/28", "0.0.0.0/0", "172.16.0.0/12",
                                     "10.1.2.7/30", "bogus"});
        if (Pick(2) == 0 && b.cidr != "bogus") {
          b.except.push_back(OneOf<std::string>({"10.1.1.0/30", "10.1.2.0/29", "10.1.1.8/29"}));
        }
        p.ip_block = b;
        break;
      }
      default: break;  // empty peer: rejected
    }
    return p;
  }

  k8s::NetworkPolicyPort RandomPort() {
    k8s::NetworkPolicyPort p;
    p.protocol = OneOf<std::string>({"", "TCP", "UDP", "SCTP", "TCP", "ICMP"});
    switch (Pick(5)) {
      case 0: break;  // every port
      case 1: p.port = k8s::IntOrString{false, static_cast<int32_t>(OneOf<int>({53, 80, 8080, 0})), ""}; break;
      case 2:
        p.port = k8s::IntOrString{false, 80, ""};
        p.end_port = OneOf<int64_t>({90, 1000, 70});
        break;
      default: p.port = k8s::IntOrString{true, 0, OneOf<std::string>({"http", "dns", "none"})};
    }
    return p;
  }

  std::vector<k8s::NetworkPolicyRule> RandomRules() {
    std::vector<k8s::NetworkPolicyRule> out(Pick(3));
    for (auto& r : out) {
      size_t peers = Pick(3), ports = Pick(3);
      for (size_t i = 0; i < peers; ++i) r.peers.push_back(RandomPeer());
      for (size_t i = 0; i < ports; ++i) r.ports.push_back(RandomPort());
    }
    return out;
  }

  std::shared_ptr<const k8s::NetworkPolicy> RandomPolicy(const std::string& ns,
                                                         const std::string& name) {
    auto np = std::make_shared<k8s::NetworkPolicy>();
    np->meta.namespace_ = ns;
    np->meta.name = name;
    np->spec.pod_selector = RandomSelector(true);
    switch (Pick(5)) {
      case 0: np->spec.policy_types = {"Ingress"}; break;
      case 1: np->spec.policy_types = {"Egress"}; break;
      case 2: np->spec.policy_types = {"Ingress", "Egress"}; break;
      default: break;
    }
    np->spec.ingress = RandomRules();
    np->spec.egress = RandomRules();
    if (Pick(30) == 0) np->spec.error = "undecodable";
    return np;
  }

  std::string AddPolicy() {
    auto np = RandomPolicy(absl::StrCat("ns", Pick(4)), absl::StrCat("np", next_policy_++));
    in_.policies.push_back(np);
    return "add policy " + np->meta.Key();
  }

  std::mt19937 rng_;
  PolicyInput in_;
  int next_pod_ = 0, next_policy_ = 0;
  uint32_t next_ep_ = 1;
};

void ExpectEqual(const PolicyTranslation& full, const PolicyTranslation& cached,
                 const std::string& where) {
  EXPECT_EQ(full.ipcache, cached.ipcache) << where;
  EXPECT_EQ(full.problems, cached.problems) << where;
  ASSERT_EQ(full.endpoints.size(), cached.endpoints.size()) << where;
  for (size_t i = 0; i < full.endpoints.size(); ++i) {
    EXPECT_EQ(full.endpoints[i], cached.endpoints[i])
        << where << ": endpoint " << full.endpoints[i].endpoint_id << " ("
        << full.endpoints[i].pod << ")";
  }
}

TEST(TranslationCacheTest, RandomChangeSequencesGiveTheFullTranslation) {
  size_t compared = 0, nonempty = 0;
  for (uint32_t seed = 1; seed <= 24; ++seed) {
    World world(seed);
    IdentityAllocator full_ids, cached_ids;
    TranslationCache cache;
    for (int step = 0; step < 150; ++step) {
      std::string what = step == 0 ? "initial" : world.Change();
      const std::string where = absl::StrCat("seed ", seed, " step ", step, " (", what, ")");
      PolicyTranslation full = TranslatePolicy(world.input(), &full_ids);
      PolicyTranslation cached = TranslatePolicy(world.input(), &cached_ids, &cache);
      ExpectEqual(full, cached, where);
      ASSERT_EQ(full_ids.Records(), cached_ids.Records()) << where;
      if (::testing::Test::HasFailure()) return;
      ++compared;
      for (const EndpointPolicy& ep : full.endpoints) nonempty += ep.allows.empty() ? 0 : 1;
    }
  }
  EXPECT_EQ(compared, 24u * 150u);
  // The sequences exercise real allow entries, not only closed or open endpoints.
  EXPECT_GT(nonempty, compared);
}

// A cache that outlives a translation without it (or one skipped batch) stays right: its
// identity deltas no longer line up with its entries.
TEST(TranslationCacheTest, SkippedBatchesAndASecondCacheStayEqual) {
  World world(7);
  IdentityAllocator full_ids, cached_ids;
  TranslationCache cache;
  for (int step = 0; step < 200; ++step) {
    std::string what = world.Change();
    PolicyTranslation full = TranslatePolicy(world.input(), &full_ids);
    PolicyTranslation cached = step % 3 == 1 ? TranslatePolicy(world.input(), &cached_ids)
                                             : TranslatePolicy(world.input(), &cached_ids, &cache);
    ExpectEqual(full, cached, absl::StrCat("step ", step, " (", what, ")"));
    ASSERT_EQ(full_ids.Records(), cached_ids.Records());
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace sluice::agent
