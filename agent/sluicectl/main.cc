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
//   sluicectl observe [--last N] [--follow] [filters] [-o table|json]
//                                            flows from the agent's flow monitor (observe.cc)
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
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
    "drops|endpoints|nat|services|identities|policy get NAMESPACE/POD|observe [options]";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  // `observe` takes hubble's option spellings (--drop-reason, -o), which are no absl flags: what
  // follows the word is its own.
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    if (std::string(argv[i]) != "observe") break;
    std::vector<std::string> rest(argv + i + 1, argv + argc);
    absl::ParseCommandLine(i, argv);
    return sluice::ctl::Observe(rest);
  }
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  std::string cmd = args.size() > 1 ? args[1] : "";
  if (cmd == "policy") return sluice::ctl::Policy({args.begin() + 2, args.end()});
  for (const Command& c : kCommands) {
    if (cmd == c.name) return c.run();
  }
  std::fprintf(stderr, "usage: %s\n", kUsage);
  return 2;
}
