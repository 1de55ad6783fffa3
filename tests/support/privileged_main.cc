// The main of every privileged test binary (*_priv_test): the tests run in a network namespace
// this process made, never in the one it was started in, so no result depends on the machine's
// routes, neighbours or sysctls (a root namespace with net.ipv4.ip_forward=1, as on any Kubernetes
// node or container host, once let bpf_fib_lookup find the machine's default route and turned
// TC_ACT_OK verdicts into TC_ACT_REDIRECT).
//
// The namespace starts with lo up and nothing else; a case that needs a route, a neighbour, a
// device or a sysctl sets it itself (or makes a namespace of its own inside this one). A new
// namespace copies its IPv4 settings from the machine's root namespace (net.core.
// devconf_inherit_init_net=0, the kernel's default), so the settings a container host or a
// Kubernetes node changes are put back to the kernel's defaults here. ctest runs each test in a
// process of its own, so each test gets a namespace of its own.
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace {

// Settings a new namespace copies from the machine's root namespace, with the kernel's defaults.
// net.ipv4.ip_forward also sets conf/all/forwarding, conf/default/forwarding and every device's.
constexpr struct {
  const char* path;
  const char* value;
} kDefaults[] = {
    {"/proc/sys/net/ipv4/ip_forward", "0"},               // docker, podman, Kubernetes: 1
    {"/proc/sys/net/ipv4/conf/all/rp_filter", "0"},       // systemd: 2
    {"/proc/sys/net/ipv4/conf/default/rp_filter", "0"},   // systemd: 2
    {"/proc/sys/net/ipv4/conf/all/route_localnet", "0"},  // kube-proxy: 1
    {"/proc/sys/net/ipv4/conf/default/route_localnet", "0"},
};

bool Fail(const char* what, const std::string& arg) {
  std::fprintf(stderr, "privileged test: %s%s: %s (needs root: CAP_SYS_ADMIN, CAP_NET_ADMIN)\n",
               what, arg.c_str(), std::strerror(errno));
  return false;
}

bool WriteSysctl(const char* path, const char* value) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Fail("open ", path);
  bool ok = write(fd, value, std::strlen(value)) == static_cast<ssize_t>(std::strlen(value));
  int saved = errno;
  close(fd);
  errno = saved;
  return ok || Fail("write ", path);
}

// Moves the process (its only thread: nothing has started another yet) into a new network
// namespace with lo up and the kernel's defaults for kDefaults.
bool EnterOwnNetns() {
  if (unshare(CLONE_NEWNET) != 0) return Fail("unshare(CLONE_NEWNET)", "");
  for (const auto& d : kDefaults) {
    if (!WriteSysctl(d.path, d.value)) return false;
  }
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return Fail("socket", "");
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  bool ok = ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
  ifr.ifr_flags |= IFF_UP;
  ok = ok && ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
  int saved = errno;
  close(s);
  errno = saved;
  return ok || Fail("set lo up", "");
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Listing the tests (ctest's discovery at build time) runs none and needs no privilege.
  if (!GTEST_FLAG_GET(list_tests) && !EnterOwnNetns()) return 1;
  return RUN_ALL_TESTS();
}
