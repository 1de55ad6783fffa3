// Configuration: kubeconfig variants (data vs file, relative paths, refusals), the explicit
// apiserver address override, in-cluster service account with token rotation.
#include "agent/k8s/config.h"

#include <map>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "agent/base/fake_clock.h"
#include "support/temp_dir.h"
#include "support/test_certs.h"

namespace sluice::k8s {
namespace {

using ::sluice::FakeClock;
using ::sluice::testing::TempDir;
using ::sluice::testing::WriteFile;
using ::testing::HasSubstr;

std::string B64(const std::string& s) {
  std::string out;
  absl::Base64Escape(s, &out);
  return out;
}

std::string Kubeconfig(const std::string& cluster, const std::string& user,
                       const std::string& current = "main") {
  return "apiVersion: v1\nkind: Config\ncurrent-context: " + current +
         "\ncontexts:\n- name: main\n  context:\n    cluster: c1\n    user: u1\n"
         "- name: other\n  context:\n    cluster: c2\n    user: u1\n"
         "clusters:\n- name: c1\n  cluster:\n" + cluster +
         "- name: c2\n  cluster:\n    server: https://10.0.0.2:443\n"
         "    certificate-authority: /abs/ca2.crt\n"
         "users:\n- name: u1\n  user:\n" + user;
}

TEST(KubeconfigTest, InlineDataIsDecoded) {
  TempDir dir;
  WriteFile(dir / "kc",
            Kubeconfig("    server: https://192.168.1.10:6443/\n    certificate-authority-data: " +
                           B64("CA-PEM") + "\n",
                       "    client-certificate-data: " + B64("CERT-PEM") +
                           "\n    client-key-data: " + B64("KEY-PEM") + "\n"));
  auto cfg = LoadKubeconfig(dir / "kc", "");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://192.168.1.10:6443");
  EXPECT_EQ(cfg->ca_pem, "CA-PEM");
  EXPECT_TRUE(cfg->ca_file.empty());
  EXPECT_EQ(cfg->client_cert_pem, "CERT-PEM");
  EXPECT_EQ(cfg->client_key_pem, "KEY-PEM");
}

TEST(KubeconfigTest, FilesResolveRelativeToTheKubeconfig) {
  TempDir dir;
  WriteFile(dir / "kc",
            Kubeconfig("    server: https://[fd00::1]:6443\n    certificate-authority: ca.crt\n",
                       "    client-certificate: certs/client.crt\n    client-key: /abs/client.key\n"
                       "    tokenFile: tok\n"));
  auto cfg = LoadKubeconfig(dir / "kc", "");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://[fd00::1]:6443");
  EXPECT_EQ(cfg->ca_file, dir / "ca.crt");
  EXPECT_EQ(cfg->client_cert_file, dir / "certs/client.crt");
  EXPECT_EQ(cfg->client_key_file, "/abs/client.key");
  EXPECT_EQ(cfg->token_file, dir / "tok");
}

TEST(KubeconfigTest, ContextOverrideAndStaticToken) {
  TempDir dir;
  WriteFile(dir / "kc", Kubeconfig("    server: https://a:1\n", "    token: abc\n"));
  auto cfg = LoadKubeconfig(dir / "kc", "other");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://10.0.0.2:443");
  EXPECT_EQ(cfg->ca_file, "/abs/ca2.crt");
  EXPECT_EQ(cfg->token, "abc");
  EXPECT_FALSE(LoadKubeconfig(dir / "kc", "missing").ok());
}

TEST(KubeconfigTest, RefusesWhatWouldWeakenOrBreakAuthentication) {
  TempDir dir;
  struct Case {
    std::string cluster, user, why;
  } cases[] = {
      {"    server: https://a:1\n    insecure-skip-tls-verify: true\n", "    token: t\n",
       "insecure-skip-tls-verify is refused"},
      {"    server: http://a:1\n", "    token: t\n", "not https"},
      {"    server: https://a:1\n", "    exec:\n      command: x\n", "exec"},
      {"    server: https://a:1\n", "    client-certificate: c.crt\n", "together"},
      {"    server: https://a:1\n    certificate-authority-data: '!!!'\n", "    token: t\n",
       "base64"},
  };
  for (const Case& c : cases) {
    WriteFile(dir / "kc", Kubeconfig(c.cluster, c.user));
    auto cfg = LoadKubeconfig(dir / "kc", "");
    ASSERT_FALSE(cfg.ok()) << c.why;
    EXPECT_THAT(std::string(cfg.status().message()), HasSubstr(c.why));
  }
  WriteFile(dir / "kc", "{ not: [yaml");
  EXPECT_FALSE(LoadKubeconfig(dir / "kc", "").ok());
  EXPECT_FALSE(LoadKubeconfig(dir / "absent", "").ok());
}

class InClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteFile(dir_ / "token", "tok-1\n");
    WriteFile(dir_ / "ca.crt", "CA");
    opts_.service_account_dir = dir_.path();
    opts_.getenv = [this](const std::string& k) -> std::optional<std::string> {
      auto it = env_.find(k);
      if (it == env_.end()) return std::nullopt;
      return it->second;
    };
  }
  TempDir dir_;
  std::map<std::string, std::string> env_;
  ConfigOptions opts_;
};

TEST_F(InClusterTest, ServiceAccountAndEnvironment) {
  env_ = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}};
  auto cfg = LoadClientConfig(opts_);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://10.96.0.1:443");
  EXPECT_EQ(cfg->token_file, dir_ / "token");
  EXPECT_EQ(cfg->ca_file, dir_ / "ca.crt");
  env_["KUBERNETES_SERVICE_HOST"] = "fd00::1";
  cfg = LoadClientConfig(opts_);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->server, "https://[fd00::1]:443");
}

TEST_F(InClusterTest, ExplicitAddressOverridesTheServiceIp) {
  env_ = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}};
  opts_.k8s_service_host = "192.168.0.10";
  opts_.k8s_service_port = "6443";
  auto cfg = LoadClientConfig(opts_);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://192.168.0.10:6443");
  EXPECT_EQ(cfg->token_file, dir_ / "token");
  // Works without the env vars too (the agent's pod before its datapath is up).
  env_.clear();
  cfg = LoadClientConfig(opts_);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://192.168.0.10:6443");
  opts_.k8s_service_port.clear();
  EXPECT_FALSE(LoadClientConfig(opts_).ok());
}

TEST_F(InClusterTest, KubeconfigFlagBeatsInClusterAndExplicitAddressBeatsBoth) {
  env_ = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}};
  WriteFile(dir_ / "kc", Kubeconfig("    server: https://kc:6443\n", "    token: kctok\n"));
  opts_.kubeconfig = dir_ / "kc";
  auto cfg = LoadClientConfig(opts_);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://kc:6443");
  EXPECT_EQ(cfg->token, "kctok");
  opts_.k8s_service_host = "127.0.0.1";
  opts_.k8s_service_port = "7443";
  cfg = LoadClientConfig(opts_);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->server, "https://127.0.0.1:7443");
  EXPECT_EQ(cfg->token, "kctok");
}

TEST_F(InClusterTest, KubeconfigEnvIsTheLastResort) {
  WriteFile(dir_ / "kc", Kubeconfig("    server: https://kc:6443\n", "    token: t\n"));
  env_ = {{"KUBECONFIG", dir_ / "missing" + ":" + dir_ / "kc"}};
  auto cfg = LoadClientConfig(opts_);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->server, "https://kc:6443");
  env_.clear();
  EXPECT_FALSE(LoadClientConfig(opts_).ok());
}

TEST_F(InClusterTest, TokenIsReReadEveryMinuteAndOnDemand) {
  FakeClock clock;
  TokenSource tokens("", dir_ / "token", absl::Minutes(1), &clock);
  EXPECT_EQ(tokens.Token(), "tok-1");
  WriteFile(dir_ / "token", "tok-2\n");
  clock.Advance(absl::Seconds(30));
  EXPECT_EQ(tokens.Token(), "tok-1");  // cached
  clock.Advance(absl::Seconds(31));
  EXPECT_EQ(tokens.Token(), "tok-2");  // a minute old: re-read
  WriteFile(dir_ / "token", "tok-3");
  EXPECT_EQ(tokens.Token(), "tok-2");
  EXPECT_TRUE(tokens.Invalidate());  // what a 401 does
  EXPECT_EQ(tokens.Token(), "tok-3");
  EXPECT_EQ(tokens.file_reads(), 3u);
  // A vanished file keeps the last good token.
  std::filesystem::remove(dir_ / "token");
  clock.Advance(absl::Minutes(2));
  EXPECT_EQ(tokens.Token(), "tok-3");

  TokenSource fixed("static", "", absl::Minutes(1), &clock);
  EXPECT_EQ(fixed.Token(), "static");
  EXPECT_FALSE(fixed.Invalidate());
}

}  // namespace
}  // namespace sluice::k8s
