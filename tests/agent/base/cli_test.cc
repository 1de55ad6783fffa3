// The binaries as an operator first meets them: --help exits 0 and lists the binary's own flags
// (not abseil's), --version prints the build's version, a bad --log_level is a start-up error,
// errors name flags as they are spelled, a stray word is refused with the usage instead of
// starting a daemon, and a user who is not root is told what is needed. Runs the built binaries;
// no root needed but for the last (which runs them as nobody through setpriv).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/base/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Ran {
  int code = -1;
  std::string out;  // stdout and stderr
};

Ran RunShell(const std::string& command) {
  Ran r;
  FILE* p = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Ran RunBinary(const std::string& binary, const std::string& args, const std::string& env = "") {
  return RunShell(absl::StrCat(env, " ", SLUICE_BUILD_DIR, "/", binary, " ", args));
}

// Runs a binary as a user who is not root (the test itself runs as root).
constexpr const char* kAsNobody =
    "setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all";

constexpr const char* kAgent = "agent/sluice-agent";
constexpr const char* kOperator = "agent/sluice-operator";
constexpr const char* kCtl = "agent/sluicectl";
constexpr const char* kLab = "agent/lab/sluice-lab";
constexpr const char* kCni = "cni/sluice-cni";

TEST(BinariesTest, AgentHelpExitsZeroAndListsItsOwnFlags) {
  Ran r = RunBinary(kAgent, "--help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--pod_cidr=")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--log_level=info")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--health_address=127.0.0.1:9879")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--metrics_address=")) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("No flags matched"))) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("--flagfile"))) << r.out;  // abseil's own
}

TEST(BinariesTest, SluicectlHelpExitsZeroAndListsItsFlagsAndCommands) {
  Ran r = RunBinary(kCtl, "--help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--bpffs_root=")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("services")) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("--flagfile"))) << r.out;
}

TEST(BinariesTest, LabAndCniHelpExitZero) {
  Ran lab = RunBinary(kLab, "--help");
  EXPECT_EQ(lab.code, 0) << lab.out;
  EXPECT_THAT(lab.out, HasSubstr("--nodes N")) << lab.out;
  Ran cni = RunBinary(kCni, "--help", "env -u CNI_COMMAND");
  EXPECT_EQ(cni.code, 0) << cni.out;
  EXPECT_THAT(cni.out, HasSubstr("CNI_COMMAND")) << cni.out;
}

TEST(BinariesTest, EveryBinaryPrintsTheConfiguredVersion) {
  for (const char* b : {kAgent, kOperator, kCtl, kLab}) {
    Ran r = RunBinary(b, "--version");
    EXPECT_EQ(r.code, 0) << b << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(SLUICE_VERSION_STRING)) << b;
  }
  Ran cni = RunBinary(kCni, "--version", "env -u CNI_COMMAND");
  EXPECT_EQ(cni.code, 0) << cni.out;
  EXPECT_THAT(cni.out, HasSubstr(SLUICE_VERSION_STRING));
  Ran ctl = RunBinary(kCtl, "version");
  EXPECT_EQ(ctl.code, 0) << ctl.out;
  EXPECT_THAT(ctl.out, HasSubstr(absl::StrCat("sluicectl ", SLUICE_VERSION)));
  // A real version: the project's and git's, never a placeholder.
  EXPECT_THAT(std::string(SLUICE_VERSION_STRING), Not(HasSubstr("@")));
}

TEST(BinariesTest, AgentRefusesAnUnknownLogLevel) {
  Ran r = RunBinary(kAgent, "--log_level=verbose --pod_cidr=10.99.0.0/24 --health_address=");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--log_level=verbose: want one of trace")) << r.out;
}

TEST(BinariesTest, AgentErrorsNameFlagsAsTheyAreSpelled) {
  Ran r = RunBinary(kAgent, "--pod_cidr=10.99.0.0/24 --health_address= --nat_port_range=9-1",
                    "env -u KUBERNETES_SERVICE_HOST");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--nat_port_range")) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("--nat-port-range"))) << r.out;
  Ran m =
      RunBinary(kAgent, "--pod_cidr=10.99.0.0/24 --health_address= --non_masquerade_cidrs=nonsense",
                "env -u KUBERNETES_SERVICE_HOST");
  EXPECT_NE(m.code, 0) << m.out;
  EXPECT_THAT(m.out, HasSubstr("--non_masquerade_cidrs")) << m.out;
}

TEST(BinariesTest, AgentRefusesAHealthAddressItCannotServe) {
  Ran r = RunBinary(kAgent, "--pod_cidr=10.99.0.0/24 --health_address=nonsense");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--health_address: nonsense: want HOST:PORT")) << r.out;
}

TEST(BinariesTest, OperatorHelpExitsZeroAndListsItsOwnFlags) {
  Ran r = RunBinary(kOperator, "--help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--cluster_pool_ipv4_pod_cidr_list=")) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("--flagfile"))) << r.out;
}

TEST(BinariesTest, OperatorVersionIsTheBuildsNotAbseils) {
  Ran r = RunBinary(kOperator, "--version");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("sluice-operator ", SLUICE_VERSION_STRING))) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("NDEBUG"))) << r.out;
}

// A daemon given a word it does not take refuses it before it starts anything. The flags after
// the word would make a started daemon fail at once (a bad pod CIDR, an apiserver that is not
// there), so a regression shows as the wrong exit code, never as a daemon left running.
TEST(BinariesTest, DaemonsRefuseAPositionalArgumentWithUsage) {
  Ran agent = RunBinary(kAgent, "help --pod_cidr=nonsense --health_address=", "timeout 20");
  EXPECT_EQ(agent.code, 2) << agent.out;
  EXPECT_THAT(agent.out, HasSubstr("sluice-agent: unexpected argument 'help'")) << agent.out;
  EXPECT_THAT(agent.out, HasSubstr("usage: sluice-agent")) << agent.out;
  Ran op = RunBinary(kOperator,
                     "version --kubeconfig=/nonexistent/kubeconfig --health_address= "
                     "--cluster_pool_ipv4_pod_cidr_list=nonsense",
                     "timeout 20");
  EXPECT_EQ(op.code, 2) << op.out;
  EXPECT_THAT(op.out, HasSubstr("sluice-operator: unexpected argument 'version'")) << op.out;
  EXPECT_THAT(op.out, HasSubstr("usage: sluice-operator")) << op.out;
}

TEST(BinariesTest, ToolsRefuseWordsTheirCommandsDoNotTake) {
  Ran status = RunBinary(kCtl, "status now");
  EXPECT_EQ(status.code, 2) << status.out;
  EXPECT_THAT(status.out, HasSubstr("sluicectl: unexpected argument 'now'")) << status.out;
  Ran unknown = RunBinary(kCtl, "stauts");
  EXPECT_EQ(unknown.code, 2) << unknown.out;
  EXPECT_THAT(unknown.out, HasSubstr("sluicectl: unexpected argument 'stauts'")) << unknown.out;
  EXPECT_THAT(unknown.out, HasSubstr("commands: status")) << unknown.out;
  Ran lab = RunBinary(kLab, "status extra");
  EXPECT_EQ(lab.code, 2) << lab.out;
  EXPECT_THAT(lab.out, HasSubstr("sluice-lab: status: unexpected argument 'extra'")) << lab.out;
  Ran node = RunBinary(kLab, "sluicectl");
  EXPECT_EQ(node.code, 2) << node.out;
  EXPECT_THAT(node.out, HasSubstr("sluicectl NODE")) << node.out;
}

TEST(BinariesTest, VersionHonoursJsonOutput) {
  Ran r = RunBinary(kCtl, "-o json --agent=127.0.0.1:1 version");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("\"sluicectl\": \"", SLUICE_VERSION_STRING, "\"")))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"error\": \"the agent does not answer on 127.0.0.1:1")) << r.out;
}

// Without an agent to ask, sluicectl says which defaults it reads and what to pass, on stderr.
TEST(BinariesTest, SluicectlWithoutAnAgentSaysWhatToPass) {
  Ran r = RunBinary(kCtl, "--agent=127.0.0.1:1 --bpffs_root=/nonexistent/bpf drops");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("the agent does not answer on 127.0.0.1:1")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("reads the defaults --state_dir=/var/lib/sluice")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--node NODE")) << r.out;
}

// Not root: each binary says what it needs instead of a bare EPERM/EACCES or an abort. sluicectl
// meets a root-only bpffs with a pinned map in it, as on a node (mounted here: the test's own).
TEST(BinariesTest, NotRootIsToldWhatIsNeeded) {
  if (geteuid() != 0) GTEST_SKIP() << "sets up a bpffs as root (CI runs as root)";
  char dir_template[] = "/tmp/sluice-cli-bpffs-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  Ran setup =
      RunShell(absl::StrCat("mount -t bpf -o mode=700 bpf ", dir, " && bpftool map create ", dir,
                            "/sluice_drops type array key 4 value 4 entries 1 name sluice_drops"));
  Ran ctl = RunBinary(kCtl, absl::StrCat("--bpffs_root=", dir, " --state_dir=", dir, " drops"),
                      kAsNobody);
  RunShell(absl::StrCat("umount ", dir, " && rmdir ", dir));
  ASSERT_EQ(setup.code, 0) << setup.out;
  EXPECT_EQ(ctl.code, 1) << ctl.out;
  EXPECT_THAT(ctl.out, HasSubstr(absl::StrCat(dir, "/sluice_drops: EACCES"))) << ctl.out;
  EXPECT_THAT(ctl.out, HasSubstr("run it as root (or with CAP_BPF")) << ctl.out;
  Ran lab = RunBinary(kLab, "up --name opnobody", kAsNobody);
  EXPECT_EQ(lab.code, 1) << lab.out;
  EXPECT_THAT(lab.out, HasSubstr("/run/sluice-lab")) << lab.out;
  EXPECT_THAT(lab.out, HasSubstr("sluice-lab runs as root")) << lab.out;
  Ran agent = RunBinary(kAgent,
                        "--pod_cidr=10.99.0.0/24 --health_address= --bpffs_root=/sys/fs/bpf/opnb "
                        "--state_dir=/nonexistent/sluice-opnobody --install_cni=false",
                        absl::StrCat("env -u KUBERNETES_SERVICE_HOST timeout 20 ", kAsNobody));
  EXPECT_EQ(agent.code, 1) << agent.out;
  EXPECT_THAT(agent.out, HasSubstr("EPERM")) << agent.out;
  EXPECT_THAT(agent.out, HasSubstr("run it as root (or with CAP_BPF, CAP_NET_ADMIN")) << agent.out;
}

TEST(BinariesTest, UnknownFlagIsAnError) {
  Ran r = RunBinary(kCtl, "--no_such_flag drops");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("no_such_flag")) << r.out;
}

}  // namespace
}  // namespace sluice
