#include "agent/base/config_dir.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

// Flags of this test binary stand in for the agent's.
ABSL_FLAG(std::string, cfg_name, "default", "a string flag");
ABSL_FLAG(int, cfg_mtu, 0, "an int flag");
ABSL_FLAG(bool, cfg_enabled, true, "a bool flag");
ABSL_FLAG(std::vector<std::string>, cfg_cidrs, {}, "a list flag");

namespace sluice::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class ConfigDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-config-dir-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& rel, const std::string& content) {
    fs::create_directories(fs::path(dir_ + "/" + rel).parent_path());
    std::ofstream(dir_ + "/" + rel) << content;
  }
  std::string dir_;
  absl::FlagSaver saver_;  // every test starts from the defaults
};

TEST_F(ConfigDirTest, EachFileSetsTheFlagOfItsName) {
  Write("cfg_name", "node-a\n");  // ConfigMap values written with `|` end in a newline
  Write("cfg_mtu", "1450");
  Write("cfg_enabled", "false\n");
  Write("cfg_cidrs", "10.0.0.0/8,192.168.0.0/16");
  auto applied = ApplyConfigDir(dir_, {});
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_THAT(*applied, ElementsAre("cfg_cidrs", "cfg_enabled", "cfg_mtu", "cfg_name"));
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_name), "node-a");
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_mtu), 1450);
  EXPECT_FALSE(absl::GetFlag(FLAGS_cfg_enabled));
  EXPECT_THAT(absl::GetFlag(FLAGS_cfg_cidrs), ElementsAre("10.0.0.0/8", "192.168.0.0/16"));
}

TEST_F(ConfigDirTest, CommandLineWinsOverTheFile) {
  absl::SetFlag(&FLAGS_cfg_mtu, 9000);  // as ParseCommandLine would have set it
  Write("cfg_mtu", "1450");
  Write("cfg_name", "from-file");
  auto applied = ApplyConfigDir(dir_, {"cfg_mtu"});
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_THAT(*applied, ElementsAre("cfg_name"));
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_mtu), 9000);
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_name), "from-file");
}

// What the kubelet mounts for a ConfigMap: key -> ..data/key, ..data -> ..<timestamp>/.
TEST_F(ConfigDirTest, KubeletSymlinkFarmIsReadThroughItsLinks) {
  Write("..2026_12_01_20_00_00.123/cfg_name", "via-symlink\n");
  Write("..2026_12_01_20_00_00.123/cfg_mtu", "1400\n");
  fs::create_directory_symlink("..2026_12_01_20_00_00.123", dir_ + "/..data");
  fs::create_symlink("..data/cfg_name", dir_ + "/cfg_name");
  fs::create_symlink("..data/cfg_mtu", dir_ + "/cfg_mtu");
  auto applied = ApplyConfigDir(dir_, {});
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_THAT(*applied, ElementsAre("cfg_mtu", "cfg_name"));
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_name), "via-symlink");
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_mtu), 1400);
}

TEST_F(ConfigDirTest, UnknownKeyIsAnErrorNamingTheFile) {
  Write("cfg_typo", "1");
  auto applied = ApplyConfigDir(dir_, {});
  ASSERT_FALSE(applied.ok());
  EXPECT_THAT(applied.status().message(), HasSubstr(dir_ + "/cfg_typo"));
  EXPECT_THAT(applied.status().message(), HasSubstr("no agent flag --cfg_typo"));
}

TEST_F(ConfigDirTest, BadValueIsAnErrorNamingTheFileAndValue) {
  Write("cfg_mtu", "fifteen hundred");
  auto applied = ApplyConfigDir(dir_, {});
  ASSERT_FALSE(applied.ok());
  EXPECT_THAT(applied.status().message(), HasSubstr(dir_ + "/cfg_mtu"));
  EXPECT_THAT(applied.status().message(), HasSubstr("'fifteen hundred'"));
}

TEST_F(ConfigDirTest, BadValueIsRefusedEvenWhenTheCommandLineOverridesIt) {
  absl::SetFlag(&FLAGS_cfg_enabled, false);
  Write("cfg_enabled", "maybe");
  auto applied = ApplyConfigDir(dir_, {"cfg_enabled"});
  ASSERT_FALSE(applied.ok());
  EXPECT_THAT(applied.status().message(), HasSubstr("cfg_enabled"));
  EXPECT_FALSE(absl::GetFlag(FLAGS_cfg_enabled));
}

TEST_F(ConfigDirTest, AbslsOwnFlagsAreNotConfiguration) {
  Write("flagfile", "/etc/passwd");
  auto applied = ApplyConfigDir(dir_, {});
  ASSERT_FALSE(applied.ok());
  EXPECT_THAT(applied.status().message(), HasSubstr("no agent flag --flagfile"));
}

TEST_F(ConfigDirTest, SubdirectoryIsAnError) {
  fs::create_directory(dir_ + "/cfg_name");
  auto applied = ApplyConfigDir(dir_, {});
  ASSERT_FALSE(applied.ok());
  EXPECT_THAT(applied.status().message(), HasSubstr("not a file"));
}

TEST_F(ConfigDirTest, MissingDirectoryIsAnError) {
  EXPECT_FALSE(ApplyConfigDir(dir_ + "/absent", {}).ok());
}

TEST_F(ConfigDirTest, EmptyDirectoryAppliesNothing) {
  auto applied = ApplyConfigDir(dir_, {});
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_THAT(*applied, IsEmpty());
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_name), "default");
}

TEST(FlagsOnCommandLineTest, FindsEverySpelling) {
  std::vector<std::string> args = {"sluice-agent",    "--cfg_name=x", "-cfg_mtu", "9000",
                                   "--nocfg_enabled", "positional",   "--",       "--cfg_cidrs=y"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto names = FlagsOnCommandLine(static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(names.contains("cfg_name"));
  EXPECT_TRUE(names.contains("cfg_mtu"));
  EXPECT_TRUE(names.contains("cfg_enabled"));
  EXPECT_FALSE(names.contains("cfg_cidrs"));  // after "--": an argument, not a flag
  EXPECT_FALSE(names.contains("positional"));
}

}  // namespace
}  // namespace sluice::agent
