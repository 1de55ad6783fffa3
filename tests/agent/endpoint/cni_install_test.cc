// CNI install lifecycle on real files in a temp dir: another plugin's configurations, the
// binaries the runtime needs, uninstall.
#include "agent/endpoint/cni_install.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class CniInstallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-cni-install-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    opts_.conf_dir = root_ + "/net.d";
    opts_.bin_dir = root_ + "/bin";
    opts_.plugin_source = root_ + "/sluice-cni";
    opts_.socket_path = "/run/sluice/sluice.sock";
    fs::create_directories(opts_.conf_dir);
    fs::create_directories(opts_.bin_dir);
    Write(opts_.plugin_source, "#!/bin/sh\n", 0755);
  }
  void TearDown() override { fs::remove_all(root_); }
  static void Write(const std::string& path, const std::string& content, mode_t mode = 0644) {
    std::ofstream(path) << content;
    ::chmod(path.c_str(), mode);
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::set<std::string> Files(const std::string& dir) {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename());
    return out;
  }
  std::string root_;
  CniInstallOptions opts_;
};

TEST_F(CniInstallTest, InstallWritesThePluginAndConflistAndLeavesOthersByDefault) {
  Write(opts_.conf_dir + "/10-calico.conflist", R"({"name":"k8s-pod-network"})");
  Write(opts_.conf_dir + "/99-loopback.conf", R"({"type":"loopback"})");
  auto report = InstallCni(opts_);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->renamed, IsEmpty());
  EXPECT_THAT(report->before_ours, IsEmpty()) << "both sort after 05-sluice.conflist";
  EXPECT_EQ(
      Files(opts_.conf_dir),
      (std::set<std::string>{"05-sluice.conflist", "10-calico.conflist", "99-loopback.conf"}));
  EXPECT_THAT(Read(opts_.conf_dir + "/05-sluice.conflist"), HasSubstr(R"("type": "sluice")"));
  // The runtime hands pods' bandwidth annotations only to a plugin declaring the capability.
  auto conflist = nlohmann::json::parse(Read(opts_.conf_dir + "/05-sluice.conflist"));
  EXPECT_EQ(conflist["plugins"][0]["capabilities"], (nlohmann::json{{"bandwidth", true}}));
  EXPECT_EQ(Read(opts_.bin_dir + "/sluice"), "#!/bin/sh\n");
  EXPECT_EQ(::access((opts_.bin_dir + "/sluice").c_str(), X_OK), 0);
}

TEST_F(CniInstallTest, AnInstallOverTheSameFilesKeepsThemAndAChangedPluginOrModeIsRewritten) {
  ASSERT_TRUE(InstallCni(opts_).ok());
  const std::string plugin = opts_.bin_dir + "/sluice";
  const std::string conflist = opts_.conf_dir + "/05-sluice.conflist";
  struct stat plugin_before, conflist_before;
  ASSERT_EQ(::stat(plugin.c_str(), &plugin_before), 0);
  ASSERT_EQ(::stat(conflist.c_str(), &conflist_before), 0);

  ASSERT_TRUE(InstallCni(opts_).ok());  // a restarted agent
  struct stat st;
  ASSERT_EQ(::stat(plugin.c_str(), &st), 0);
  EXPECT_EQ(st.st_ino, plugin_before.st_ino) << "the same bytes are not written again";
  ASSERT_EQ(::stat(conflist.c_str(), &st), 0);
  EXPECT_EQ(st.st_ino, conflist_before.st_ino);

  Write(opts_.plugin_source, "#!/bin/sh\nexit 0\n", 0755);  // an upgrade
  opts_.mtu = 1400;
  ASSERT_TRUE(InstallCni(opts_).ok());
  EXPECT_EQ(Read(plugin), "#!/bin/sh\nexit 0\n");
  EXPECT_THAT(Read(conflist), HasSubstr(R"("mtu": 1400)"));

  ::chmod(plugin.c_str(), 0644);  // same bytes, not executable
  ASSERT_TRUE(InstallCni(opts_).ok());
  EXPECT_EQ(::access(plugin.c_str(), X_OK), 0);
}

TEST_F(CniInstallTest, AConfigurationSortingBeforeOursIsNamed) {
  Write(opts_.conf_dir + "/00-flannel.conflist", "{}");
  Write(opts_.conf_dir + "/10-calico.conflist", "{}");
  Write(opts_.conf_dir + "/01-notes.txt", "not a CNI configuration");
  auto report = InstallCni(opts_);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->before_ours, ElementsAre("00-flannel.conflist"));
  EXPECT_TRUE(fs::exists(opts_.conf_dir + "/00-flannel.conflist")) << "left in place";
}

TEST_F(CniInstallTest, ExclusiveRenamesEveryOtherConfiguration) {
  opts_.exclusive = true;
  Write(opts_.conf_dir + "/00-flannel.conflist", "flannel");
  Write(opts_.conf_dir + "/10-calico.conflist", "calico");
  Write(opts_.conf_dir + "/87-podman.json", "podman");
  Write(opts_.conf_dir + "/README", "kept");
  auto report = InstallCni(opts_);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->renamed,
              ElementsAre("00-flannel.conflist", "10-calico.conflist", "87-podman.json"));
  EXPECT_EQ(Files(opts_.conf_dir),
            (std::set<std::string>{"05-sluice.conflist", "00-flannel.conflist.sluice_bak",
                                   "10-calico.conflist.sluice_bak", "87-podman.json.sluice_bak",
                                   "README"}));
  EXPECT_EQ(Read(opts_.conf_dir + "/10-calico.conflist.sluice_bak"), "calico");
  // A second install (an agent restart) finds only its own configuration.
  auto again = InstallCni(opts_);
  ASSERT_TRUE(again.ok());
  EXPECT_THAT(again->renamed, IsEmpty());
}

TEST_F(CniInstallTest, LoopbackIsRequiredAndCheckedExecutable) {
  EXPECT_THAT(RequiredCniBinaries(opts_), ElementsAre("loopback"));
  absl::Status st = CheckCniBinaries(opts_);
  EXPECT_TRUE(absl::IsFailedPrecondition(st));
  EXPECT_THAT(st.message(), HasSubstr("missing in " + opts_.bin_dir + ": loopback"));
  Write(opts_.bin_dir + "/loopback", "x", 0644);  // not executable
  EXPECT_FALSE(CheckCniBinaries(opts_).ok());
  ::chmod((opts_.bin_dir + "/loopback").c_str(), 0755);
  EXPECT_TRUE(CheckCniBinaries(opts_).ok());
}

TEST_F(CniInstallTest, UninstallRemovesOurFilesAndRestoresTheOthers) {
  opts_.exclusive = true;
  Write(opts_.conf_dir + "/10-calico.conflist", "calico");
  Write(opts_.conf_dir + "/20-other.conf", "other");
  Write(opts_.bin_dir + "/loopback", "x", 0755);
  ASSERT_TRUE(InstallCni(opts_).ok());
  // Since the install, the other plugin wrote its configuration again: that one stays.
  Write(opts_.conf_dir + "/20-other.conf", "rewritten");
  ASSERT_TRUE(UninstallCni(opts_).ok());
  EXPECT_EQ(Files(opts_.conf_dir), (std::set<std::string>{"10-calico.conflist", "20-other.conf",
                                                          "20-other.conf.sluice_bak"}));
  EXPECT_EQ(Read(opts_.conf_dir + "/10-calico.conflist"), "calico");
  EXPECT_EQ(Read(opts_.conf_dir + "/20-other.conf"), "rewritten");
  EXPECT_EQ(Files(opts_.bin_dir), (std::set<std::string>{"loopback"}));
  // Nothing left to remove is not an error.
  EXPECT_TRUE(UninstallCni(opts_).ok());
}

TEST_F(CniInstallTest, InstallWithoutThePluginBinaryFailsAndWritesNoConflist) {
  opts_.plugin_source = root_ + "/absent";
  EXPECT_TRUE(absl::IsNotFound(InstallCni(opts_).status()));
  EXPECT_FALSE(fs::exists(opts_.conf_dir + "/05-sluice.conflist"));
}

}  // namespace
}  // namespace sluice::agent
