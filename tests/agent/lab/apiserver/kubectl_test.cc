// Acceptance: the real kubectl against the lab apiserver over HTTPS with a written kubeconfig.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/lab_client.h"
#include "agent/lab/node/events.h"

namespace sluice::lab {
namespace {

using nlohmann::json;
using ::sluice::testing::Eventually;

struct KubectlRun {
  int rc;
  std::string out;
};

class KubectlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists("/usr/bin/kubectl")) GTEST_FAIL() << "kubectl is not installed";
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("sluice-lab-kubectl-", getpid(), "-", rand());
    std::filesystem::create_directories(dir_);
    ApiServerOptions o;
    o.address = "127.0.0.1";
    o.port = 0;
    o.pod_log_dir = (dir_ / "logs").string();
    std::filesystem::create_directories(o.pod_log_dir);
    server_ = std::make_unique<ApiServer>(o);
    ASSERT_TRUE(server_->Start().ok());
    kubeconfig_ = (dir_ / "kubeconfig").string();
    ASSERT_TRUE(server_->WriteKubeconfig(kubeconfig_).ok());
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  KubectlRun Kubectl(const std::string& args) {
    std::string cmd = absl::StrCat("HOME=", dir_.string(), " /usr/bin/kubectl --kubeconfig ",
                                   kubeconfig_, " --cache-dir ", (dir_ / "cache").string(),
                                   " --request-timeout=20s ", args, " 2>&1");
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    int status = pclose(p);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path dir_;
  std::string kubeconfig_;
  std::unique_ptr<ApiServer> server_;
};

constexpr char kManifest[] = R"(apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: http
---
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: default
  labels:
    app: web
spec:
  nodeName: lab-node-1
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: nginx
    ports:
    - name: http
      containerPort: 8080
---
apiVersion: v1
kind: Pod
metadata:
  name: web-2
  namespace: default
  labels:
    app: web
spec:
  nodeName: lab-node-2
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: nginx
    ports:
    - name: http
      containerPort: 8080
)";

TEST_F(KubectlTest, ApplyServiceAndPodsSeeEndpointSlicesThenDeleteThem) {
  KubectlRun version = Kubectl("version -o json");
  ASSERT_EQ(version.rc, 0) << version.out;
  EXPECT_NE(version.out.find("v1.32.0-sluice-lab"), std::string::npos) << version.out;

  std::string manifest = WriteFile("web.yaml", kManifest);
  KubectlRun apply = Kubectl(absl::StrCat("apply --validate=false -f ", manifest));
  ASSERT_EQ(apply.rc, 0) << apply.out;
  EXPECT_NE(apply.out.find("service/web created"), std::string::npos) << apply.out;
  EXPECT_NE(apply.out.find("pod/web-2 created"), std::string::npos) << apply.out;

  KubectlRun ip = Kubectl("get svc web -o jsonpath={.spec.clusterIP}");
  ASSERT_EQ(ip.rc, 0) << ip.out;
  EXPECT_EQ(ip.out.rfind("10.96.", 0), 0u) << ip.out;

  // The lab's node side: the pods get an IP and become Ready.
  testing::LabClient api(*server_);
  int n = 0;
  for (const char* pod : {"web-1", "web-2"}) {
    json status = {{"status",
                    {{"phase", "Running"},
                     {"podIP", absl::StrCat("10.244.0.", 10 + n++)},
                     {"conditions", json::array({{{"type", "Ready"}, {"status", "True"}}})}}}};
    auto r = api.Patch(absl::StrCat("/api/v1/namespaces/default/pods/", pod, "/status"), status);
    ASSERT_EQ(r.status, 200) << r.raw;
  }

  KubectlRun wait = Kubectl("wait --for=condition=Ready pod/web-1 pod/web-2 --timeout=20s");
  ASSERT_EQ(wait.rc, 0) << wait.out;

  json slices;
  ASSERT_TRUE(Eventually([&] {
    KubectlRun get = Kubectl("get endpointslices -l kubernetes.io/service-name=web -o json");
    if (get.rc != 0) return false;
    slices = json::parse(get.out, nullptr, false);
    return !slices.is_discarded() && slices["items"].size() == 1 &&
           slices["items"][0]["endpoints"].size() == 2;
  })) << slices.dump(2);
  const json& slice = slices["items"][0];
  EXPECT_EQ(slice["ports"], json::parse(R"([{"name":"http","port":8080,"protocol":"TCP"}])"));
  EXPECT_EQ(slice["endpoints"][0]["addresses"][0], "10.244.0.10");
  EXPECT_EQ(slice["endpoints"][0]["conditions"]["ready"], true);
  EXPECT_EQ(slice["endpoints"][1]["nodeName"], "lab-node-2");

  KubectlRun table = Kubectl("get endpointslices -l kubernetes.io/service-name=web");
  ASSERT_EQ(table.rc, 0) << table.out;
  EXPECT_NE(table.out.find("web-"), std::string::npos) << table.out;

  // A second apply with a change goes through GET + strategic merge PATCH.
  std::string changed = kManifest;
  changed.replace(changed.find("port: 80\n"), 9, "port: 81\n");
  KubectlRun reapply =
      Kubectl(absl::StrCat("apply --validate=false -f ", WriteFile("web2.yaml", changed)));
  ASSERT_EQ(reapply.rc, 0) << reapply.out;
  EXPECT_NE(reapply.out.find("service/web configured"), std::string::npos) << reapply.out;
  EXPECT_NE(reapply.out.find("pod/web-1 unchanged"), std::string::npos) << reapply.out;
  KubectlRun port = Kubectl("get svc web -o jsonpath={.spec.ports[*].port}");
  EXPECT_EQ(port.out, "81");

  KubectlRun del = Kubectl(absl::StrCat("delete -f ", manifest, " --timeout=30s"));
  ASSERT_EQ(del.rc, 0) << del.out;
  KubectlRun pods = Kubectl("get pods -o name");
  EXPECT_EQ(pods.rc, 0) << pods.out;
  EXPECT_EQ(pods.out.find("web-"), std::string::npos) << pods.out;
  EXPECT_TRUE(Eventually([&] {
    KubectlRun get = Kubectl("get endpointslices -l kubernetes.io/service-name=web -o json");
    json j = json::parse(get.out, nullptr, false);
    return get.rc == 0 && !j.is_discarded() && j["items"].empty();
  }));
}

TEST_F(KubectlTest, GetWatchStreamsChanges) {
  testing::LabClient api(*server_);
  std::string cmd =
      absl::StrCat("HOME=", dir_.string(), " timeout 5 /usr/bin/kubectl --kubeconfig ", kubeconfig_,
                   " --cache-dir ", (dir_ / "cache").string(), " get namespaces -w -o name 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  // kubectl lists first; wait for the initial output, then create a namespace.
  char line[512];
  ASSERT_NE(fgets(line, sizeof(line), p), nullptr);
  ASSERT_EQ(api.Post("/api/v1/namespaces", {{"metadata", {{"name", "watched"}}}}).status, 201);
  bool seen = false;
  while (fgets(line, sizeof(line), p) != nullptr) {
    if (std::string(line).find("namespace/watched") != std::string::npos) {
      seen = true;
      break;
    }
  }
  pclose(p);
  EXPECT_TRUE(seen);
}

// What an operator sees: kubectl's usual columns from server-side Tables.
TEST_F(KubectlTest, GetPrintsTheUsualColumnsFromServerSideTables) {
  testing::LabClient api(*server_);
  ASSERT_EQ(
      api.Post(
             "/api/v1/nodes",
             {{"metadata", {{"name", "node1"}}},
              {"status",
               {{"conditions", json::array({{{"type", "Ready"}, {"status", "True"}}})},
                {"addresses", json::array({{{"type", "InternalIP"}, {"address", "172.30.9.11"}}})},
                {"nodeInfo", {{"kubeletVersion", "v1.32.0-sluice-lab"}}}}}})
          .status,
      201);
  ASSERT_EQ(api.Post("/api/v1/namespaces/default/pods",
                     {{"metadata", {{"name", "web-1"}, {"labels", {{"app", "web"}}}}},
                      {"spec", {{"nodeName", "node1"}, {"containers", {{{"name", "app"}}}}}}})
                .status,
            201);
  ASSERT_EQ(
      api.Patch(
             "/api/v1/namespaces/default/pods/web-1/status",
             {{"status",
               {{"phase", "Running"},
                {"podIP", "10.244.0.10"},
                {"containerStatuses", json::array({{{"name", "app"},
                                                    {"ready", true},
                                                    {"restartCount", 0},
                                                    {"state", {{"running", json::object()}}}}})}}}})
          .status,
      200);
  KubectlRun pods = Kubectl("get pods -o wide");
  ASSERT_EQ(pods.rc, 0) << pods.out;
  for (const char* want : {"NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE",
                           "NOMINATED NODE", "web-1", "1/1", "Running", "10.244.0.10", "node1"}) {
    EXPECT_NE(pods.out.find(want), std::string::npos) << want << " in\n" << pods.out;
  }
  KubectlRun narrow = Kubectl("get pods");
  EXPECT_EQ(narrow.out.find("10.244.0.10"), std::string::npos) << narrow.out;  // -o wide only

  std::string manifest = WriteFile("svc.yaml", R"(apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
)");
  ASSERT_EQ(Kubectl(absl::StrCat("apply --validate=false -f ", manifest)).rc, 0);
  KubectlRun svc = Kubectl("get svc web -o wide");
  ASSERT_EQ(svc.rc, 0) << svc.out;
  for (const char* want : {"TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "SELECTOR", "NodePort",
                           "10.96.", "80:3", "/TCP", "app=web"}) {
    EXPECT_NE(svc.out.find(want), std::string::npos) << want << " in\n" << svc.out;
  }
  KubectlRun nodes = Kubectl("get nodes -o wide");
  ASSERT_EQ(nodes.rc, 0) << nodes.out;
  for (const char* want : {"STATUS", "ROLES", "VERSION", "INTERNAL-IP", "node1", "Ready",
                           "v1.32.0-sluice-lab", "172.30.9.11"}) {
    EXPECT_NE(nodes.out.find(want), std::string::npos) << want << " in\n" << nodes.out;
  }
  KubectlRun slices = Kubectl("get endpointslices");
  ASSERT_EQ(slices.rc, 0) << slices.out;
  EXPECT_NE(slices.out.find("ADDRESSTYPE"), std::string::npos) << slices.out;
  // Across namespaces kubectl adds NAMESPACE from each row's object metadata.
  KubectlRun all = Kubectl("get pods -A");
  EXPECT_NE(all.out.find("NAMESPACE"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("default"), std::string::npos) << all.out;
  // Sorting needs whole objects in the rows (includeObject=Object).
  KubectlRun sorted = Kubectl("get pods --sort-by=.metadata.name");
  EXPECT_EQ(sorted.rc, 0) << sorted.out;
  EXPECT_NE(sorted.out.find("web-1"), std::string::npos) << sorted.out;
}

TEST_F(KubectlTest, CreateServiceClusterIpThenGetSvcShowsIt) {
  KubectlRun create = Kubectl("create service clusterip web --tcp=80:8080");
  ASSERT_EQ(create.rc, 0) << create.out;
  EXPECT_NE(create.out.find("service/web created"), std::string::npos) << create.out;
  KubectlRun get = Kubectl("get svc web");
  ASSERT_EQ(get.rc, 0) << get.out;
  EXPECT_NE(get.out.find("ClusterIP"), std::string::npos) << get.out;
  EXPECT_NE(get.out.find("80/TCP"), std::string::npos) << get.out;
  KubectlRun spec =
      Kubectl("get svc web -o jsonpath={.spec.ports[0].targetPort},{.spec.selector.app}");
  EXPECT_EQ(spec.out, "8080,web");
  // The same typed client (protobuf) creates namespaces.
  KubectlRun ns = Kubectl("create namespace team");
  ASSERT_EQ(ns.rc, 0) << ns.out;
  KubectlRun get_ns = Kubectl("get namespace team");
  EXPECT_NE(get_ns.out.find("Active"), std::string::npos) << get_ns.out;
}

TEST_F(KubectlTest, DescribePodAndGetEventsShowTheKubeletsEvents) {
  testing::LabClient api(*server_);
  auto pod = api.Post("/api/v1/namespaces/default/pods",
                      {{"metadata", {{"name", "stuck"}}},
                       {"spec", {{"nodeName", "node2"}, {"containers", {{{"name", "app"}}}}}}});
  ASSERT_EQ(pod.status, 201);
  EventRecorder events(&server_->store());
  const std::string message =
      "Failed to create pod sandbox: plugin type=\"sluice\" failed (add): pool exhausted";
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(
        events.Record(pod.body, "Warning", "FailedCreatePodSandBox", message, {"kubelet", "node2"})
            .ok());
  }
  KubectlRun describe = Kubectl("describe pod stuck");
  ASSERT_EQ(describe.rc, 0) << describe.out;
  EXPECT_NE(describe.out.find("Events:"), std::string::npos) << describe.out;
  EXPECT_NE(describe.out.find("Warning  FailedCreatePodSandBox"), std::string::npos)
      << describe.out;
  EXPECT_NE(describe.out.find("pool exhausted"), std::string::npos) << describe.out;
  EXPECT_NE(describe.out.find("(x2 over"), std::string::npos) << describe.out;
  KubectlRun get = Kubectl("get events");
  ASSERT_EQ(get.rc, 0) << get.out;
  for (const char* want : {"LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE", "Warning",
                           "FailedCreatePodSandBox", "pod/stuck", "pool exhausted"}) {
    EXPECT_NE(get.out.find(want), std::string::npos) << want << " in\n" << get.out;
  }
}

TEST_F(KubectlTest, LogsPrintsThePodsLogAndAnUnknownPodIsNotFound) {
  testing::LabClient api(*server_);
  ASSERT_EQ(api.Post("/api/v1/namespaces/default/pods",
                     {{"metadata", {{"name", "web"}}},
                      {"spec", {{"nodeName", "node1"}, {"containers", {{{"name", "app"}}}}}}})
                .status,
            201);
  ASSERT_EQ(
      api.Patch("/api/v1/namespaces/default/pods/web/status", {{"status", {{"phase", "Running"}}}})
          .status,
      200);
  std::ofstream(dir_ / "logs" / "default_web.log")
      << "netexec web serving port 8080 tcp\ntcp request from 10.244.0.9:4000: \"hostname\"\n";
  KubectlRun logs = Kubectl("logs web");
  ASSERT_EQ(logs.rc, 0) << logs.out;
  EXPECT_EQ(logs.out,
            "netexec web serving port 8080 tcp\ntcp request from 10.244.0.9:4000: \"hostname\"\n");
  KubectlRun tail = Kubectl("logs web --tail=1");
  EXPECT_EQ(tail.out, "tcp request from 10.244.0.9:4000: \"hostname\"\n");
  KubectlRun unknown = Kubectl("logs nobody");
  EXPECT_NE(unknown.rc, 0);
  EXPECT_NE(unknown.out.find("pods \"nobody\" not found"), std::string::npos) << unknown.out;
}

TEST_F(KubectlTest, GetPodsWatchPrintsRowsOfTheTableEvents) {
  testing::LabClient api(*server_);
  auto pod = [](const std::string& name) {
    return json{{"metadata", {{"name", name}}},
                {"spec", {{"nodeName", "node1"}, {"containers", {{{"name", "c"}}}}}}};
  };
  ASSERT_EQ(api.Post("/api/v1/namespaces/default/pods", pod("first")).status, 201);
  std::string cmd = absl::StrCat("echo $$; HOME=", dir_.string(),
                                 " exec timeout 20 /usr/bin/kubectl --kubeconfig ", kubeconfig_,
                                 " --cache-dir ", (dir_ / "cache").string(), " get pods -w 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[512];
  ASSERT_NE(fgets(line, sizeof(line), p), nullptr);
  const pid_t watcher = atoi(line);  // `timeout`, which passes a SIGTERM on to kubectl
  ASSERT_GT(watcher, 0);
  std::vector<std::string> lines;
  // The header and the first pod's row come from the list, then the watch's one-row Tables.
  while (lines.size() < 2 && fgets(line, sizeof(line), p) != nullptr) lines.emplace_back(line);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[0].starts_with("NAME ")) << lines[0];
  EXPECT_NE(lines[0].find("STATUS"), std::string::npos) << lines[0];
  EXPECT_TRUE(lines[1].starts_with("first ")) << lines[1];
  ASSERT_EQ(api.Post("/api/v1/namespaces/default/pods", pod("second")).status, 201);
  bool seen = false;
  while (fgets(line, sizeof(line), p) != nullptr) {
    if (std::string(line).starts_with("second ")) {
      seen = std::string(line).find("Pending") != std::string::npos;
      break;
    }
  }
  kill(watcher, SIGTERM);
  pclose(p);
  EXPECT_TRUE(seen) << "no row for the second pod";
}

TEST_F(KubectlTest, CreateWithoutValidateFalseNeedsOpenApi) {
  // Documents the known limit: no OpenAPI document is served.
  std::string manifest =
      WriteFile("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n");
  KubectlRun create = Kubectl(absl::StrCat("create -f ", manifest));
  EXPECT_NE(create.rc, 0);
  KubectlRun lenient = Kubectl(absl::StrCat("create --validate=false -f ", manifest));
  EXPECT_EQ(lenient.rc, 0) << lenient.out;
}

}  // namespace
}  // namespace sluice::lab
