#include "agent/lab/network/router.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "agent/base/errno.h"
#include "agent/base/files.h"
#include "agent/lab/tools/process.h"

namespace sluice::lab {
namespace {

namespace fs = std::filesystem;

constexpr char kZebra[] = "/usr/lib/frr/zebra";
constexpr char kBgpd[] = "/usr/lib/frr/bgpd";

}  // namespace

std::string RouterBgpConfig(const Topology& t) {
  std::string underlay = absl::StrCat("172.30.", t.index, ".0/", t.prefix_len);
  // Timers 3/9 s: a node that goes away is withdrawn within 9 s. Graceful restart: a node's
  // speaker restarting keeps its routes here (stale) until it is back. The route map makes
  // the router the next hop of everything it announces, also of one node's pod CIDR to another
  // node on the same underlay (eBGP would otherwise keep that node as a third-party next hop).
  return absl::StrCat(
      "! Written by sluice-lab (agent/lab/network/router.cc).\n", "hostname ", t.router_netns, "\n",
      "log stdout informational\n", "router bgp ", kRouterAsn, "\n", " bgp router-id ", t.router_ip,
      "\n", " no bgp ebgp-requires-policy\n", " no bgp default ipv4-unicast\n",
      " bgp graceful-restart\n", " bgp bestpath as-path multipath-relax\n",
      " neighbor NODES peer-group\n", " neighbor NODES remote-as external\n",
      " neighbor NODES timers 3 9\n", " bgp listen range ", underlay, " peer-group NODES\n",
      " address-family ipv4 unicast\n", "  network ", t.client_net, "\n",
      "  neighbor NODES activate\n", "  neighbor NODES as-override\n",
      "  neighbor NODES route-map NODES-OUT out\n", " exit-address-family\n", "exit\n",
      "route-map NODES-OUT permit 10\n", " set ip next-hop peer-address\n", "exit\n");
}

absl::StatusOr<std::vector<pid_t>> StartRouter(const Topology& t) {
  for (const char* bin : {kZebra, kBgpd}) {
    if (access(bin, X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(bin, " not found: FRR is not installed (make deps)"));
    }
  }
  passwd* frr = getpwnam("frr");
  if (frr == nullptr) return absl::NotFoundError("no user frr: FRR is not installed (make deps)");
  // The daemons drop to the user frr, and then write their pid files and vty sockets here.
  std::string dir = t.router_dir();
  std::string pathspace = absl::StrCat("/run/frr/", t.frr_pathspace());
  for (const auto& d : {dir, pathspace}) {
    std::error_code ec;
    fs::create_directories(d, ec);
    if (ec) return absl::InternalError(absl::StrCat("create ", d, ": ", ec.message()));
    if (chown(d.c_str(), frr->pw_uid, frr->pw_gid) != 0) {
      return sluice::ErrnoStatus(errno, absl::StrCat("chown frr ", d));
    }
  }
  std::string zebra_conf = absl::StrCat("hostname ", t.router_netns, "\nip forwarding\n");
  if (auto st = agent::WriteFileAtomically(dir, "zebra.conf", zebra_conf, 0644,
                                           agent::Durability::kProcessCrash);
      !st.ok()) {
    return st;
  }
  if (auto st = agent::WriteFileAtomically(dir, "bgpd.conf", RouterBgpConfig(t), 0644,
                                           agent::Durability::kProcessCrash);
      !st.ok()) {
    return st;
  }
  std::vector<pid_t> pids;
  for (const char* daemon : {"zebra", "bgpd"}) {
    std::string bin = daemon == std::string("zebra") ? kZebra : kBgpd;
    auto pid =
        StartProcess({.argv = {bin, "-N", t.frr_pathspace(), "--vty_socket", dir, "-u", "frr", "-g",
                               "frr", "-P", "0", "-f", absl::StrCat(dir, "/", daemon, ".conf"),
                               "-i", absl::StrCat(dir, "/", daemon, ".pid")},
                      .netns_path = t.netns_path(t.router_netns),
                      .log_path = absl::StrCat(dir, "/", daemon, ".log")});
    if (!pid.ok()) {
      for (pid_t p : pids) StopProcess(p);
      return pid.status();
    }
    pids.push_back(*pid);
    // bgpd needs zebra's socket; both are ready once their vty socket exists.
    std::string vty = absl::StrCat(dir, "/", daemon, ".vty");
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!fs::exists(vty)) {
      if (auto code = ReapIfExited(*pid)) {
        pids.pop_back();
        for (pid_t p : pids) StopProcess(p);
        return absl::InternalError(
            absl::StrCat(daemon, " exited with ", *code, ": see ", dir, "/", daemon, ".log"));
      }
      if (absl::Now() > deadline) {
        for (pid_t p : pids) StopProcess(p);
        return absl::DeadlineExceededError(absl::StrCat(daemon, " did not start"));
      }
      usleep(20'000);
    }
  }
  return pids;
}

}  // namespace sluice::lab
