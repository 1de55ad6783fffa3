// Decoding of list pages, each kind's fields, watch events and Status objects; malformed input is
// an error, never a crash.
#include "agent/k8s/decode.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::k8s {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kService[] = R"({
  "kind":"Service","apiVersion":"v1",
  "metadata":{"name":"web","namespace":"shop","uid":"u-1","resourceVersion":"42",
    "labels":{"app":"web"},"annotations":{"a":"b"},"managedFields":[{"x":1}],
    "ownerReferences":[{"kind":"X","name":"n0","uid":"o0"},{"kind":"Y","name":"n1","uid":"o1","controller":true}]},
  "spec":{"type":"LoadBalancer","clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10","fd00::10"],
    "externalIPs":["192.0.2.1"],
    "ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":"http-alt","nodePort":30080},
             {"name":"dns","protocol":"UDP","port":53,"targetPort":5353}],
    "selector":{"app":"web"},"sessionAffinity":"ClientIP",
    "sessionAffinityConfig":{"clientIP":{"timeoutSeconds":600}},
    "externalTrafficPolicy":"Local","internalTrafficPolicy":"Cluster","healthCheckNodePort":31000,
    "loadBalancerSourceRanges":[" 10.0.0.0/8 ","fd00::/8"],"unknownField":{"deep":[1,2,{"x":"}"}]}},
  "status":{"loadBalancer":{"ingress":[{"ip":"198.51.100.7"},{"ip":"198.51.100.8","ipMode":"Proxy"},
    {"hostname":"lb.example"}]}}})";

TEST(DecodeTest, ServiceFieldsAreDecoded) {
  Decoder d;
  Service s;
  ASSERT_TRUE(d.Decode(kService, &s).ok());
  EXPECT_EQ(s.meta.name, "web");
  EXPECT_EQ(s.meta.namespace_, "shop");
  EXPECT_EQ(s.meta.Key(), "shop/web");
  EXPECT_EQ(s.meta.uid, "u-1");
  EXPECT_EQ(s.meta.resource_version, "42");
  // Validated but not kept: nothing in the agent reads them (model.h).
  EXPECT_TRUE(s.meta.labels.empty());
  EXPECT_TRUE(s.meta.annotations.empty());
  EXPECT_FALSE(s.meta.deleting);
  EXPECT_EQ(s.type, "LoadBalancer");
  EXPECT_THAT(s.cluster_ips, ElementsAre("10.96.0.10", "fd00::10"));
  EXPECT_FALSE(s.headless);
  EXPECT_THAT(s.external_ips, ElementsAre("192.0.2.1"));
  ASSERT_EQ(s.ports.size(), 2u);
  EXPECT_EQ(s.ports[0].name, "http");
  EXPECT_EQ(s.ports[0].protocol, Protocol::kTCP);
  EXPECT_EQ(s.ports[0].port, 80);
  EXPECT_TRUE(s.ports[0].target_port.is_name);
  EXPECT_EQ(s.ports[0].target_port.name, "http-alt");
  EXPECT_EQ(s.ports[0].node_port, 30080);
  EXPECT_EQ(s.ports[1].protocol, Protocol::kUDP);
  EXPECT_FALSE(s.ports[1].target_port.is_name);
  EXPECT_EQ(s.ports[1].target_port.number, 5353);
  EXPECT_EQ(s.selector.at("app"), "web");
  EXPECT_TRUE(s.session_affinity_client_ip);
  EXPECT_EQ(s.session_affinity_timeout_seconds, 600);
  EXPECT_EQ(s.external_traffic_policy, "Local");
  EXPECT_EQ(s.internal_traffic_policy, "Cluster");
  EXPECT_EQ(s.health_check_node_port, 31000);
  EXPECT_THAT(s.load_balancer_ingress_ips, ElementsAre("198.51.100.7"));
  EXPECT_THAT(s.load_balancer_source_ranges, ElementsAre("10.0.0.0/8", "fd00::/8"));
}

// What a DELETED event (or the removal of a refused object) needs, from an object the full
// decoder refuses.
TEST(DecodeTest, IdentityDecodesWhereTheFullDecodeRefuses) {
  const std::string bad = R"({"kind":"Service","metadata":{"name":"upd","namespace":"default",
    "uid":"u-9","resourceVersion":"77","labels":{"a":1},"generation":3},
    "spec":{"sessionAffinityConfig":{"clientIP":{"timeoutSeconds":1099511627776}},
    "ports":[{"port":"eighty"}]}})";
  Decoder d;
  Service svc;
  absl::Status full = d.Decode(bad, &svc);
  EXPECT_FALSE(full.ok());
  ObjectMeta id;
  ASSERT_TRUE(d.DecodeIdentity(bad, &id).ok());
  EXPECT_EQ(id.Key(), "default/upd");
  EXPECT_EQ(id.uid, "u-9");
  EXPECT_EQ(id.resource_version, "77");
  // No name, or not JSON: nothing to act on.
  EXPECT_FALSE(d.DecodeIdentity(R"({"metadata":{"namespace":"default"}})", &id).ok());
  EXPECT_FALSE(d.DecodeIdentity(R"({"metadata":{"name":"x")", &id).ok());
}

TEST(DecodeTest, HeadlessServiceAndDefaults) {
  Decoder d;
  Service s;
  ASSERT_TRUE(d.Decode(R"({"metadata":{"name":"h","namespace":"n","deletionTimestamp":"2024-01-01T00:00:00Z"},
      "spec":{"clusterIP":"None","sessionAffinity":"ClientIP","ports":[{"port":80}]}})",
                       &s)
                  .ok());
  EXPECT_TRUE(s.headless);
  EXPECT_TRUE(s.cluster_ips.empty());
  EXPECT_TRUE(s.meta.deleting);
  EXPECT_EQ(s.session_affinity_timeout_seconds, 10800);
  EXPECT_EQ(s.ports[0].protocol, Protocol::kTCP);
  Service single;
  ASSERT_TRUE(d.Decode(R"({"metadata":{"name":"a"},"spec":{"clusterIP":"10.0.0.1"}})", &single).ok());
  EXPECT_THAT(single.cluster_ips, ElementsAre("10.0.0.1"));
}

TEST(DecodeTest, EndpointSliceConditionsDefaultWhenAbsent) {
  Decoder d;
  EndpointSlice es;
  ASSERT_TRUE(d.Decode(R"({"metadata":{"name":"web-abc","namespace":"shop",
      "labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv6",
      "endpoints":[{"addresses":["fd00::1","fd00::2"],"conditions":{"ready":false,"serving":true,"terminating":true},
                    "nodeName":"n1","zone":"z1","targetRef":{"kind":"Pod","name":"web-0","namespace":"shop"}},
                   {"addresses":["fd00::3"]},
                   {"addresses":["fd00::4"],"conditions":{"ready":null}}],
      "ports":[{"name":"http","protocol":"TCP","port":8080},{"name":"","port":null},{"protocol":"SCTP","port":9}]})",
                       &es)
                  .ok());
  EXPECT_EQ(es.service_name, "web");
  EXPECT_EQ(es.address_type, "IPv6");
  ASSERT_EQ(es.endpoints.size(), 3u);
  EXPECT_EQ(es.endpoints[0].address, "fd00::1");  // the first of its addresses
  EXPECT_FALSE(es.endpoints[0].ready);
  EXPECT_TRUE(es.endpoints[0].serving);
  EXPECT_TRUE(es.endpoints[0].terminating);
  EXPECT_EQ(es.endpoints[0].node_name, "n1");
  EXPECT_TRUE(es.endpoints[1].ready);
  EXPECT_TRUE(es.endpoints[1].serving);
  EXPECT_FALSE(es.endpoints[1].terminating);
  EXPECT_TRUE(es.endpoints[2].ready);
  ASSERT_EQ(es.ports.size(), 3u);
  EXPECT_EQ(es.ports[0].port, 8080);
  EXPECT_FALSE(es.ports[1].port.has_value());
  EXPECT_EQ(es.ports[2].protocol, Protocol::kSCTP);
}

TEST(DecodeTest, PodNodeNamespaceAndPolicy) {
  Decoder d;
  Pod p;
  ASSERT_TRUE(d.Decode(R"({"metadata":{"name":"web-0","namespace":"shop","uid":"p1"},
      "spec":{"nodeName":"n1","hostNetwork":false,"containers":[{"name":"c","ports":[
        {"name":"http","containerPort":8080,"protocol":"TCP"},{"containerPort":53,"protocol":"UDP"}]}]},
      "status":{"phase":"Running","podIP":"10.1.0.5","podIPs":[{"ip":"10.1.0.5"},{"ip":"fd01::5"}],
        "hostIP":"192.168.0.1","conditions":[{"type":"Initialized","status":"True"},{"type":"Ready","status":"True"}]}})",
                       &p)
                  .ok());
  EXPECT_EQ(p.node_name, "n1");
  EXPECT_THAT(p.pod_ips, ElementsAre("10.1.0.5", "fd01::5"));
  EXPECT_EQ(p.host_ip, "192.168.0.1");
  EXPECT_EQ(p.phase, "Running");
  EXPECT_TRUE(p.ready);
  ASSERT_EQ(p.container_ports.size(), 2u);
  EXPECT_EQ(p.container_ports[0].name, "http");
  EXPECT_EQ(p.container_ports[0].port, 8080);
  EXPECT_EQ(p.container_ports[1].protocol, Protocol::kUDP);

  Pod only_pod_ip;
  ASSERT_TRUE(d.Decode(R"({"metadata":{"name":"x"},"spec":{"hostNetwork":true},"status":{"podIP":"10.1.0.6",
      "conditions":[{"type":"Ready","status":"False"}]}})", &only_pod_ip).ok());
  EXPECT_THAT(only_pod_ip.pod_ips, ElementsAre("10.1.0.6"));
  EXPECT_TRUE(only_pod_ip.host_network);
  EXPECT_FALSE(only_pod_ip.ready);

  Node n;
  ASSERT_TRUE(d.Decode(R"({"metadata":{"name":"n1","labels":{"topology.kubernetes.io/zone":"z1"}},
      "spec":{"podCIDR":"10.1.0.0/24","podCIDRs":["10.1.0.0/24","fd01::/64"]},
      "status":{"addresses":[{"type":"Hostname","address":"n1"},{"type":"InternalIP","address":"192.168.0.1"},
        {"type":"InternalIP","address":"fd00::1"}],"conditions":[{"type":"Ready","status":"True"}]}})",
                       &n)
                  .ok());
  EXPECT_EQ(n.meta.Key(), "n1");
  EXPECT_THAT(n.pod_cidrs, ElementsAre("10.1.0.0/24", "fd01::/64"));
  EXPECT_THAT(n.internal_ips, ElementsAre("192.168.0.1", "fd00::1"));
  EXPECT_TRUE(n.ready);

  Namespace ns;
  ASSERT_TRUE(d.Decode(R"({"metadata":{"name":"shop","labels":{"team":"a"}},"spec":{"finalizers":["kubernetes"]}})", &ns).ok());
  EXPECT_EQ(ns.meta.labels.at("team"), "a");

  NetworkPolicy np;
  ASSERT_TRUE(d.Decode(R"({"metadata":{"name":"deny","namespace":"shop"},
      "spec": { "podSelector" : {},
                "policyTypes": [ "Ingress" ] }})", &np).ok());
  EXPECT_EQ(np.spec_json, R"({"podSelector":{},"policyTypes":["Ingress"]})");
}

TEST(DecodeTest, ListPageIsDecodedItemByItem) {
  std::string body = R"({"kind":"ServiceList","apiVersion":"v1",
      "metadata":{"resourceVersion":"1000","continue":"tok\"en","remainingItemCount":3},
      "items":[)";
  for (int i = 0; i < 5; ++i) {
    if (i) body += ",";
    body += R"({"metadata":{"name":"s)" + std::to_string(i) +
            R"(","namespace":"ns","resourceVersion":")" + std::to_string(900 + i) +
            R"("},"spec":{"clusterIP":"10.0.0.)" + std::to_string(i) + R"("}})";
  }
  body += "]}";
  ListMeta meta;
  std::vector<Service> items;
  ListDecodeStats stats;
  ASSERT_TRUE(DecodeListBody<Service>(
                  body, &meta, [&](Service&& s) { items.push_back(std::move(s)); }, &stats)
                  .ok());
  EXPECT_EQ(meta.resource_version, "1000");
  EXPECT_EQ(meta.continue_token, "tok\"en");
  EXPECT_EQ(meta.remaining_item_count, 3);
  ASSERT_EQ(items.size(), 5u);
  EXPECT_EQ(items[4].meta.name, "s4");
  EXPECT_THAT(items[4].cluster_ips, ElementsAre("10.0.0.4"));
  EXPECT_EQ(stats.errors, 0u);
}

TEST(DecodeTest, ListWithNullOrEmptyItemsAndMetadataLast) {
  for (const char* body : {R"({"items":null,"metadata":{"resourceVersion":"7"},"kind":"PodList"})",
                           R"({"kind":"PodList","items":[],"metadata":{"resourceVersion":"7"}})"}) {
    ListMeta meta;
    ListDecodeStats stats;
    ASSERT_TRUE(DecodeListBody<Pod>(body, &meta, [](Pod&&) { FAIL(); }, &stats).ok()) << body;
    EXPECT_EQ(meta.resource_version, "7");
  }
}

TEST(DecodeTest, MalformedItemIsCountedAndSkipped) {
  const char* body = R"({"metadata":{"resourceVersion":"5"},"items":[
      {"metadata":{"name":"good"},"spec":{"ports":[{"port":80}]}},
      {"metadata":{"name":"bad"},"spec":{"ports":[{"port":"eighty"}]}},
      {"metadata":{"name":"bad2"},"spec":{"ports":[{"port":99999999999}]}},
      {"metadata":{"name":"good2"}}]})";
  ListMeta meta;
  std::vector<std::string> names;
  ListDecodeStats stats;
  ASSERT_TRUE(DecodeListBody<Service>(
                  body, &meta, [&](Service&& s) { names.push_back(s.meta.name); }, &stats)
                  .ok());
  EXPECT_THAT(names, ElementsAre("good", "good2"));
  EXPECT_EQ(stats.errors, 2u);
}

TEST(DecodeTest, MalformedListEnvelopeIsAnError) {
  for (const char* body : {R"({"metadata":{"resourceVersion":"5"},"items":[{"metadata":{}})",  // cut
                           R"([1,2])", R"({"items":[1]})", R"({"items":[]} trailing)", ""}) {
    ListMeta meta;
    ListDecodeStats stats;
    EXPECT_FALSE(DecodeListBody<Service>(body, &meta, [](Service&&) {}, &stats).ok()) << body;
  }
}

TEST(DecodeTest, WatchEventsOfEveryType) {
  Decoder d;
  RawEvent ev;
  ASSERT_TRUE(d.Decode(R"({"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"10"}}})", &ev).ok());
  EXPECT_EQ(ev.type, EventType::kAdded);
  Service s;
  ASSERT_TRUE(d.Decode(ev.object_json, &s).ok());
  EXPECT_EQ(s.meta.resource_version, "10");

  // "object" before "type" works too.
  ASSERT_TRUE(d.Decode(R"({"object":{"metadata":{"resourceVersion":"12"}},"type":"BOOKMARK"})", &ev).ok());
  EXPECT_EQ(ev.type, EventType::kBookmark);
  std::string rv;
  ASSERT_TRUE(d.DecodeResourceVersion(ev.object_json, &rv).ok());
  EXPECT_EQ(rv, "12");

  ASSERT_TRUE(d.Decode(R"({"type":"MODIFIED","object":{}})", &ev).ok());
  EXPECT_EQ(ev.type, EventType::kModified);
  ASSERT_TRUE(d.Decode(R"({"type":"DELETED","object":{}})", &ev).ok());
  EXPECT_EQ(ev.type, EventType::kDeleted);
  ASSERT_TRUE(d.Decode(R"({"type":"SURPRISE","object":{}})", &ev).ok());
  EXPECT_EQ(ev.type, EventType::kUnknown);
}

TEST(DecodeTest, ErrorEventCarriesExpiredStatus) {
  Decoder d;
  RawEvent ev;
  ASSERT_TRUE(d.Decode(R"j({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},
      "status":"Failure","message":"too old resource version: 10245 (11000)","reason":"Expired","code":410}})j",
                       &ev)
                  .ok());
  EXPECT_EQ(ev.type, EventType::kError);
  ApiStatus st;
  ASSERT_TRUE(d.Decode(ev.object_json, &st).ok());
  EXPECT_EQ(st.code, 410);
  EXPECT_TRUE(st.IsExpired());
  EXPECT_THAT(st.message, HasSubstr("too old"));

  ApiStatus too_large;
  ASSERT_TRUE(d.Decode(R"({"kind":"Status","code":504,"reason":"Timeout","details":{
      "causes":[{"reason":"ResourceVersionTooLarge","message":"Too large resource version"}],
      "retryAfterSeconds":1}})", &too_large).ok());
  EXPECT_FALSE(too_large.IsExpired());
  EXPECT_TRUE(too_large.IsTooLargeResourceVersion());
  EXPECT_EQ(too_large.retry_after_seconds, 1);
}

TEST(DecodeTest, MalformedEventsAreErrorsNotCrashes) {
  Decoder d;
  for (const char* json : {"", "{", "{\"type\":\"ADDED\"}", "{\"object\":{}}", "[]", "nonsense",
                           "{\"type\":1,\"object\":{}}", "{\"type\":\"ADDED\",\"object\":[]}",
                           "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"x\"}"}) {
    RawEvent ev;
    EXPECT_FALSE(d.Decode(json, &ev).ok()) << json;
  }
  Service s;
  EXPECT_FALSE(d.Decode(R"({"metadata":{"name":7}})", &s).ok());
  EXPECT_FALSE(d.Decode(R"({"metadata":{"labels":{"a":1}}})", &s).ok());
  EXPECT_FALSE(d.Decode(R"({"spec":{"ports":"x"}})", &s).ok());
  EXPECT_FALSE(d.Decode("{\"metadata\":{\"name\":\"\xff\xfe\"}}", &s).ok());
  // And the decoder stays usable.
  EXPECT_TRUE(d.Decode(R"({"metadata":{"name":"ok"}})", &s).ok());
  EXPECT_EQ(s.meta.name, "ok");
}

// The fields the stores do not keep are decoded as strictly as those they keep: a value of the
// wrong type anywhere is an error, never silently skipped.
TEST(DecodeTest, FieldsNotKeptAreStillValidated) {
  Decoder d;
  Service s;
  EXPECT_FALSE(d.Decode(R"({"metadata":{"name":"a","annotations":{"x":1}}})", &s).ok());
  EXPECT_FALSE(d.Decode(R"({"metadata":{"name":"a","annotations":[]}})", &s).ok());
  EXPECT_FALSE(d.Decode(R"({"metadata":{"name":"a","ownerReferences":[{"uid":5}]}})", &s).ok());
  EXPECT_FALSE(
      d.Decode(R"({"metadata":{"name":"a","ownerReferences":[{"controller":"yes"}]}})", &s).ok());
  EXPECT_FALSE(d.Decode(R"({"metadata":{"name":"a","labels":{"x":[]}}})", &s).ok());
  EndpointSlice es;
  for (const char* json : {
           R"({"metadata":{"name":"a"},"endpoints":[{"addresses":["10.0.0.1",7]}]})",
           R"({"metadata":{"name":"a"},"endpoints":[{"addresses":"10.0.0.1"}]})",
           R"({"metadata":{"name":"a"},"endpoints":[{"addresses":["10.0.0.1"],"zone":3}]})",
           R"({"metadata":{"name":"a"},"endpoints":[{"targetRef":{"kind":"Pod","name":{}}}]})",
           R"({"metadata":{"name":"a","labels":{"kubernetes.io/service-name":1}}})",
       }) {
    EXPECT_FALSE(d.Decode(json, &es).ok()) << json;
  }
  ASSERT_TRUE(d.Decode(R"({"metadata":{"name":"a","labels":{"kubernetes.io/service-name":"web",
      "x":"y"}},"endpoints":[{"addresses":[],"zone":null},{"addresses":null}]})",
                       &es)
                  .ok());
  EXPECT_EQ(es.service_name, "web");
  EXPECT_TRUE(es.meta.labels.empty());
  ASSERT_EQ(es.endpoints.size(), 2u);
  EXPECT_EQ(es.endpoints[0].address, "");
  EXPECT_EQ(es.endpoints[1].address, "");
}

}  // namespace
}  // namespace sluice::k8s
