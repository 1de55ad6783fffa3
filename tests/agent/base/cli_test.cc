// The binaries as an operator first meets them: --help exits 0 and lists the binary's own flags
// (not abseil's), --version prints the build's version, a bad --log_level is a start-up error,
// and errors name flags as they are spelled. Runs the built binaries; no root needed.
#include <sys/wait.h>

#include <cstdio>
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

Ran RunBinary(const std::string& binary, const std::string& args, const std::string& env = "") {
  Ran r;
  std::string cmd = absl::StrCat(env, " ", SLUICE_BUILD_DIR, "/", binary, " ", args, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

constexpr const char* kAgent = "agent/sluice-agent";
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
  for (const char* b : {kAgent, kCtl, kLab}) {
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

TEST(BinariesTest, UnknownFlagIsAnError) {
  Ran r = RunBinary(kCtl, "--no_such_flag drops");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("no_such_flag")) << r.out;
}

}  // namespace
}  // namespace sluice
