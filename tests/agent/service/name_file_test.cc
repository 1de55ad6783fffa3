// The Service name table sluicectl reads while the agent is down (<state_dir>/services.json):
// written when a Service's names change and only then, atomically, in /v1/services' field names.
#include "agent/service/name_file.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/temp_dir.h"

namespace sluice::agent {
namespace {

k8s::Service Web(int32_t node_port = 0) {
  k8s::Service s;
  s.meta.namespace_ = "default";
  s.meta.name = "web";
  s.cluster_ips = {"10.96.0.10"};
  s.external_ips = {"192.0.2.7"};
  s.load_balancer_ingress_ips = {"198.51.100.1"};
  k8s::ServicePort p;
  p.name = "http";
  p.port = 80;
  p.protocol = k8s::Protocol::kUDP;
  p.node_port = node_port;
  s.ports = {p};
  return s;
}

nlohmann::json ReadTable(const testing::TempDir& dir) {
  std::ifstream in(dir / kServiceNamesFile);
  std::stringstream buf;
  buf << in.rdbuf();
  return nlohmann::json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
}

TEST(ServiceNameFileTest, WritesTheNamesOfEveryServiceInTheAgentsFieldNames) {
  testing::TempDir dir("name-file");
  ServiceNameFile f(dir.path());
  k8s::Service web = Web(30080);
  f.Set("default/web", &web);
  ASSERT_TRUE(f.Flush().ok());
  nlohmann::json t = ReadTable(dir);
  ASSERT_TRUE(t.is_array()) << t;
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0]["namespace"], "default");
  EXPECT_EQ(t[0]["name"], "web");
  EXPECT_EQ(t[0]["clusterIPs"], nlohmann::json::array({"10.96.0.10"}));
  // External IPs and LoadBalancer ingress IPs are frontends alike, as in /v1/services.
  EXPECT_EQ(t[0]["externalIPs"], nlohmann::json::array({"192.0.2.7", "198.51.100.1"}));
  EXPECT_EQ(t[0]["ports"][0]["name"], "http");
  EXPECT_EQ(t[0]["ports"][0]["port"], 80);
  EXPECT_EQ(t[0]["ports"][0]["protocol"], "UDP");
  EXPECT_EQ(t[0]["ports"][0]["nodePort"], 30080);
  struct stat st;
  ASSERT_EQ(::stat((dir / kServiceNamesFile).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(ServiceNameFileTest, RewritesOnlyWhenANameOrFrontendChanged) {
  testing::TempDir dir("name-file");
  ServiceNameFile f(dir.path());
  k8s::Service web = Web();
  f.Set("default/web", &web);
  ASSERT_TRUE(f.Flush().ok());
  EXPECT_EQ(f.writes(), 1u);
  // The same Service again (an endpoint change re-applies it): nothing to write.
  f.Set("default/web", &web);
  ASSERT_TRUE(f.Flush().ok());
  EXPECT_EQ(f.writes(), 1u);
  web.ports[0].port = 81;
  f.Set("default/web", &web);
  ASSERT_TRUE(f.Flush().ok());
  EXPECT_EQ(f.writes(), 2u);
  EXPECT_EQ(ReadTable(dir)[0]["ports"][0]["port"], 81);
  // Gone: the table is rewritten without it; an unknown key that goes changes nothing.
  f.Set("default/web", nullptr);
  f.Set("default/never", nullptr);
  ASSERT_TRUE(f.Flush().ok());
  EXPECT_EQ(f.writes(), 3u);
  EXPECT_EQ(ReadTable(dir), nlohmann::json::array());
  f.Set("default/never", nullptr);
  ASSERT_TRUE(f.Flush().ok());
  EXPECT_EQ(f.writes(), 3u);
}

TEST(ServiceNameFileTest, SortsByKeyAndRetriesAFailedWrite) {
  testing::TempDir dir("name-file");
  ServiceNameFile f(dir / "missing");  // no such directory: the write fails
  k8s::Service web = Web(), api = Web();
  api.meta.name = "api";
  f.Set("default/web", &web);
  f.Set("default/api", &api);
  EXPECT_FALSE(f.Flush().ok());
  EXPECT_EQ(f.writes(), 0u);
  ASSERT_EQ(::mkdir((dir / "missing").c_str(), 0700), 0);
  ASSERT_TRUE(f.Flush().ok());  // still dirty: written now
  EXPECT_EQ(f.writes(), 1u);
  nlohmann::json t = nlohmann::json::parse(f.Json());
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0]["name"], "api");
  EXPECT_EQ(t[1]["name"], "web");
}

TEST(ServiceNameFileTest, WithoutADirectoryKeepsTheTableInMemory) {
  ServiceNameFile f("");
  k8s::Service web = Web();
  f.Set("default/web", &web);
  EXPECT_TRUE(f.Flush().ok());
  EXPECT_EQ(f.writes(), 0u);
  EXPECT_EQ(nlohmann::json::parse(f.Json()).size(), 1u);
}

}  // namespace
}  // namespace sluice::agent
