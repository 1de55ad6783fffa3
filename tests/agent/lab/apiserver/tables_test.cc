// Server-side printing: the meta.k8s.io/v1 Table the lab apiserver answers to kubectl's Accept
// header, its columns and cells per resource (as kube-apiserver's printers give them), one-row
// Tables on a watch, and plain objects for everyone else.
#include "agent/lab/apiserver/tables.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/lab_client.h"

namespace sluice::lab {
namespace {

using nlohmann::json;

constexpr char kKubectlAccept[] =
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;"
    "g=meta.k8s.io,application/json";

std::vector<std::string> ColumnNames(const json& table) {
  std::vector<std::string> names;
  for (const auto& c : table["columnDefinitions"]) names.push_back(c["name"]);
  return names;
}

TEST(TableRequested, OnlyWhenATableComesFirstInAccept) {
  auto t = TableRequested(kKubectlAccept, "");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->api_version, "meta.k8s.io/v1");
  EXPECT_EQ(t->row_object, TableRowObject::kPartialObjectMetadata);
  EXPECT_EQ(TableRequested(kKubectlAccept, "Object")->row_object, TableRowObject::kObject);
  EXPECT_EQ(TableRequested(kKubectlAccept, "None")->row_object, TableRowObject::kNone);
  EXPECT_FALSE(TableRequested("application/json", "").has_value());
  EXPECT_FALSE(TableRequested("", "").has_value());
  EXPECT_FALSE(TableRequested("application/json, application/json;as=Table;v=v1;g=meta.k8s.io", "")
                   .has_value());
  EXPECT_FALSE(TableRequested("application/json;as=Table;v=v2;g=meta.k8s.io", "").has_value());
  EXPECT_EQ(TableRequested("application/json;as=Table;v=v1beta1;g=meta.k8s.io", "")->api_version,
            "meta.k8s.io/v1beta1");
}

TEST(HumanDuration, MatchesKubectlAges) {
  EXPECT_EQ(HumanDuration(absl::Seconds(-5)), "<invalid>");
  EXPECT_EQ(HumanDuration(absl::Milliseconds(-500)), "0s");
  EXPECT_EQ(HumanDuration(absl::Seconds(45)), "45s");
  EXPECT_EQ(HumanDuration(absl::Seconds(119)), "119s");
  EXPECT_EQ(HumanDuration(absl::Seconds(150)), "2m30s");
  EXPECT_EQ(HumanDuration(absl::Minutes(5)), "5m");
  EXPECT_EQ(HumanDuration(absl::Minutes(42)), "42m");
  EXPECT_EQ(HumanDuration(absl::Minutes(200)), "3h20m");
  EXPECT_EQ(HumanDuration(absl::Hours(5)), "5h");
  EXPECT_EQ(HumanDuration(absl::Hours(30)), "30h");
  EXPECT_EQ(HumanDuration(absl::Hours(52)), "2d4h");
  EXPECT_EQ(HumanDuration(absl::Hours(24 * 30)), "30d");
  EXPECT_EQ(HumanDuration(absl::Hours(24 * 365 * 3 + 24 * 10)), "3y10d");
  EXPECT_EQ(HumanDuration(absl::Hours(24 * 365 * 9)), "9y");
}

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);
std::string Ago(absl::Duration d) { return ObjectStore::FormatTimestamp(kNow - d); }

TEST(TableCells, PodShowsReadinessStatusRestartsAgeIpAndNode) {
  json pod = {
      {"metadata", {{"name", "web-1"}, {"creationTimestamp", Ago(absl::Seconds(150))}}},
      {"spec",
       {{"nodeName", "node1"}, {"containers", json::array({{{"name", "a"}}, {{"name", "b"}}})}}},
      {"status",
       {{"phase", "Running"},
        {"podIP", "10.244.1.7"},
        {"containerStatuses", json::array({{{"name", "a"},
                                            {"ready", true},
                                            {"restartCount", 2},
                                            {"state", {{"running", json::object()}}}},
                                           {{"name", "b"},
                                            {"ready", false},
                                            {"restartCount", 1},
                                            {"state", {{"running", json::object()}}}}})}}}};
  EXPECT_EQ(ColumnNames(TableOf(Resource("pods"), {}, {"meta.k8s.io/v1"}, kNow, "1")),
            (std::vector<std::string>{"Name", "Ready", "Status", "Restarts", "Age", "IP", "Node",
                                      "Nominated Node", "Readiness Gates"}));
  EXPECT_EQ(TableCells(Resource("pods"), pod, kNow),
            json::parse(R"(["web-1","1/2","Running","3","2m30s","10.244.1.7","node1","<none>",
                            "<none>"])"));
  // A pod whose sandbox cannot be created; one being deleted.
  json pending = {
      {"metadata", {{"name", "p"}, {"creationTimestamp", Ago(absl::Seconds(9))}}},
      {"spec", {{"nodeName", "node2"}, {"containers", json::array({{{"name", "c"}}})}}},
      {"status",
       {{"phase", "Pending"},
        {"containerStatuses",
         json::array({{{"name", "c"},
                       {"ready", false},
                       {"restartCount", 0},
                       {"state", {{"waiting", {{"reason", "ContainerCreating"}}}}}}})}}}};
  EXPECT_EQ(TableCells(Resource("pods"), pending, kNow),
            json::parse(R"(["p","0/1","ContainerCreating","0","9s","<none>","node2","<none>",
                            "<none>"])"));
  pod["metadata"]["deletionTimestamp"] = Ago(absl::Seconds(-30));
  EXPECT_EQ(TableCells(Resource("pods"), pod, kNow)[2], "Terminating");
}

TEST(TableCells, ServicesShowTypeAddressesPortsAndSelector) {
  json svc = {{"metadata", {{"name", "web"}, {"creationTimestamp", Ago(absl::Minutes(42))}}},
              {"spec",
               {{"type", "NodePort"},
                {"clusterIP", "10.96.0.20"},
                {"selector", {{"tier", "fe"}, {"app", "web"}}},
                {"ports", json::array({{{"port", 80}, {"nodePort", 30080}, {"protocol", "TCP"}},
                                       {{"port", 53}, {"protocol", "UDP"}}})}}}};
  EXPECT_EQ(ColumnNames(TableOf(Resource("services"), {}, {"meta.k8s.io/v1"}, kNow, "1")),
            (std::vector<std::string>{"Name", "Type", "Cluster-IP", "External-IP", "Port(s)", "Age",
                                      "Selector"}));
  EXPECT_EQ(TableCells(Resource("services"), svc, kNow),
            json::parse(R"(["web","NodePort","10.96.0.20","<none>","80:30080/TCP,53/UDP","42m",
                            "app=web,tier=fe"])"));
  json lb = {{"metadata", {{"name", "lb"}}},
             {"spec", {{"type", "LoadBalancer"}, {"clusterIP", "10.96.0.21"}}}};
  EXPECT_EQ(TableCells(Resource("services"), lb, kNow)[3], "<pending>");
  lb["status"]["loadBalancer"]["ingress"] = json::array({{{"ip", "192.0.2.20"}}});
  EXPECT_EQ(TableCells(Resource("services"), lb, kNow)[3], "192.0.2.20");
  EXPECT_EQ(TableCells(Resource("services"), lb, kNow)[4], "<none>");
}

TEST(TableCells, NodesEndpointSlicesPoliciesAndEvents) {
  json node = {{"metadata",
                {{"name", "node1"},
                 {"creationTimestamp", Ago(absl::Hours(5))},
                 {"labels", {{"node-role.kubernetes.io/control-plane", ""}}}}},
               {"status",
                {{"conditions", json::array({{{"type", "Ready"}, {"status", "True"}}})},
                 {"addresses", json::array({{{"type", "InternalIP"}, {"address", "172.30.1.11"}}})},
                 {"nodeInfo", {{"kubeletVersion", "v1.32.0-sluice-lab"}}}}}};
  EXPECT_EQ(TableCells(Resource("nodes"), node, kNow),
            json::parse(R"(["node1","Ready","control-plane","5h","v1.32.0-sluice-lab",
                            "172.30.1.11","<none>","<unknown>","<unknown>","<unknown>"])"));
  json slice = {{"metadata", {{"name", "web-abc"}}},
                {"addressType", "IPv4"},
                {"ports", json::array({{{"port", 8080}}})},
                {"endpoints", json::array({{{"addresses", {"10.244.0.1"}}},
                                           {{"addresses", {"10.244.0.2"}}},
                                           {{"addresses", {"10.244.0.3"}}},
                                           {{"addresses", {"10.244.0.4"}}}})}};
  json cells = TableCells(Resource("endpointslices"), slice, kNow);
  EXPECT_EQ(cells[1], "IPv4");
  EXPECT_EQ(cells[2], "8080");
  EXPECT_EQ(cells[3], "10.244.0.1,10.244.0.2,10.244.0.3 + 1 more...");
  json np = {
      {"metadata", {{"name", "deny"}}},
      {"spec",
       {{"podSelector",
         {{"matchLabels", {{"app", "api"}}},
          {"matchExpressions",
           json::array({{{"key", "tier"}, {"operator", "In"}, {"values", {"a", "b"}}}})}}}}}};
  EXPECT_EQ(TableCells(Resource("networkpolicies"), np, kNow)[1], "app=api,tier in (a,b)");
  np["spec"]["podSelector"] = json::object();
  EXPECT_EQ(TableCells(Resource("networkpolicies"), np, kNow)[1], "<none>");
  json ev = {{"metadata", {{"name", "p.1"}}},
             {"involvedObject", {{"kind", "Pod"}, {"name", "p"}}},
             {"type", "Warning"},
             {"reason", "FailedCreatePodSandBox"},
             {"message", "Failed to create pod sandbox: no"},
             {"source", {{"component", "kubelet"}, {"host", "node2"}}},
             {"firstTimestamp", Ago(absl::Seconds(20))},
             {"lastTimestamp", Ago(absl::Seconds(4))},
             {"count", 5}};
  EXPECT_EQ(ColumnNames(TableOf(Resource("events"), {}, {"meta.k8s.io/v1"}, kNow, "1")),
            (std::vector<std::string>{"Last Seen", "Type", "Reason", "Object", "Subobject",
                                      "Source", "Message", "First Seen", "Count", "Name"}));
  EXPECT_EQ(TableCells(Resource("events"), ev, kNow),
            json::parse(R"(["4s","Warning","FailedCreatePodSandBox","pod/p","","kubelet, node2",
                            "Failed to create pod sandbox: no","20s","5","p.1"])"));
  // Anything else: name and age.
  EXPECT_EQ(ColumnNames(TableOf(Resource("leases"), {}, {"meta.k8s.io/v1"}, kNow, "1")),
            (std::vector<std::string>{"Name", "Holder", "Age"}));
}

class TableServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ApiServer>(ApiServerOptions{});
    ASSERT_TRUE(server_->Start().ok());
    api_ = std::make_unique<testing::LabClient>(*server_);
  }
  testing::Reply GetTable(const std::string& path) {
    return testing::ToReply(api_->raw().Get(path.c_str(), {{"Accept", kKubectlAccept}}));
  }
  std::unique_ptr<ApiServer> server_;
  std::unique_ptr<testing::LabClient> api_;
};

TEST_F(TableServerTest, ListGetAndWatchAnswerTablesOnlyWhenAsked) {
  ASSERT_EQ(api_->Post("/api/v1/namespaces/default/pods",
                       {{"metadata", {{"name", "a"}}},
                        {"spec", {{"nodeName", "n1"}, {"containers", {{{"name", "c"}}}}}}})
                .status,
            201);
  auto plain = api_->Get("/api/v1/namespaces/default/pods");
  EXPECT_EQ(plain.body["kind"], "PodList");

  auto list = GetTable("/api/v1/namespaces/default/pods?limit=500");
  ASSERT_EQ(list.status, 200) << list.raw;
  EXPECT_EQ(list.body["kind"], "Table");
  EXPECT_EQ(list.body["apiVersion"], "meta.k8s.io/v1");
  EXPECT_EQ(list.body["metadata"]["resourceVersion"], plain.body["metadata"]["resourceVersion"]);
  ASSERT_EQ(list.body["rows"].size(), 1u);
  const json& row = list.body["rows"][0];
  EXPECT_EQ(row["cells"][0], "a");
  EXPECT_EQ(row["cells"][6], "n1");
  EXPECT_EQ(row["object"]["kind"], "PartialObjectMetadata");
  EXPECT_EQ(row["object"]["metadata"]["name"], "a");
  EXPECT_FALSE(row["object"].contains("spec"));
  auto full = GetTable("/api/v1/namespaces/default/pods?includeObject=Object");
  EXPECT_EQ(full.body["rows"][0]["object"]["kind"], "Pod");
  for (const auto& c : list.body["columnDefinitions"]) {
    for (const char* field : {"name", "type", "format", "description", "priority"}) {
      EXPECT_TRUE(c.contains(field)) << c.dump() << " lacks " << field;
    }
  }

  auto one = GetTable("/api/v1/namespaces/default/pods/a");
  ASSERT_EQ(one.status, 200) << one.raw;
  EXPECT_EQ(one.body["kind"], "Table");
  EXPECT_EQ(one.body["rows"].size(), 1u);
  EXPECT_EQ(GetTable("/api/v1/namespaces/default/pods/nope").status, 404);

  // A watch: every event's object is a one-row Table.
  std::string rv = list.body["metadata"]["resourceVersion"];
  testing::Reply watched;
  auto watch_client = testing::NewClient(*server_);  // a client of its own: one request at a time
  std::thread watcher([&] {
    watched = testing::ToReply(watch_client->Get(
        absl::StrCat("/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=2&resourceVersion=",
                     rv)
            .c_str(),
        {{"Accept", kKubectlAccept}}));
  });
  ASSERT_TRUE(::sluice::testing::Eventually([&] { return server_->open_watches() == 1; }));
  ASSERT_EQ(api_->Post("/api/v1/namespaces/default/pods",
                       {{"metadata", {{"name", "b"}}}, {"spec", {{"nodeName", "n2"}}}})
                .status,
            201);
  watcher.join();
  ASSERT_EQ(watched.status, 200) << watched.raw;
  json event = json::parse(watched.raw.substr(0, watched.raw.find('\n')), nullptr, false);
  ASSERT_FALSE(event.is_discarded()) << "[" << watched.raw << "]";
  EXPECT_EQ(event["type"], "ADDED");
  EXPECT_EQ(event["object"]["kind"], "Table");
  ASSERT_EQ(event["object"]["rows"].size(), 1u);
  EXPECT_EQ(event["object"]["rows"][0]["cells"][0], "b");
  EXPECT_EQ(event["object"]["rows"][0]["cells"][6], "n2");
}

}  // namespace
}  // namespace sluice::lab
