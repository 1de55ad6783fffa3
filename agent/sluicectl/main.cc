// sluicectl: look at a node's Sluice datapath through its pinned maps. Read-only; works while
// the agent is down. One file per subcommand in this folder.
//
//   sluicectl [--bpffs_root=DIR] drops       per-reason drop counters, summed over CPUs
//   sluicectl [--bpffs_root=DIR] endpoints   the local endpoints the datapath delivers to
//   sluicectl [--bpffs_root=DIR] nat         masqueraded flows (pod tuple -> node address:port)
//   sluicectl [--bpffs_root=DIR] services    Service frontends, their flags and backend slots
//   sluicectl [--bpffs_root=DIR] [--state_dir=DIR] identities
//                                            security identities, their labels and prefixes
//   sluicectl [--bpffs_root=DIR] [--state_dir=DIR] policy get NAMESPACE/POD
//                                            a local pod's enforced directions and allows
//   sluicectl version                        this build's version
#include <cstdio>
#include <string>
#include <vector>

#include "agent/base/cli.h"
#include "agent/sluicectl/common.h"

namespace {

struct Command {
  const char* name;
  int (*run)();
};

constexpr Command kCommands[] = {
    {"drops", sluice::ctl::Drops},
    {"endpoints", sluice::ctl::Endpoints},
    {"nat", sluice::ctl::Nat},
    {"services", sluice::ctl::Services},
    {"identities", sluice::ctl::Identities},
};

constexpr char kUsage[] =
    "sluicectl [--bpffs_root=DIR] [--state_dir=DIR] "
    "drops|endpoints|nat|services|identities|policy get NAMESPACE/POD|version";

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = sluice::cli::ParseCommandLine(argc, argv, "sluicectl", kUsage);
  std::string cmd = args.size() > 1 ? args[1] : "";
  if (cmd == "version") {
    std::printf("%s\n", sluice::cli::VersionLine("sluicectl").c_str());
    return 0;
  }
  if (cmd == "policy") return sluice::ctl::Policy({args.begin() + 2, args.end()});
  for (const Command& c : kCommands) {
    if (cmd == c.name) return c.run();
  }
  std::fprintf(stderr, "usage: %s\n", kUsage);
  return 2;
}
