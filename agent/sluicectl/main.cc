// sluicectl: look at a node's Sluice datapath through its pinned maps (read-only but for
// `ct flush`; works while the agent is down), and at the running agent through its health
// server (--agent). One file per subcommand in this folder. Every list takes -o json.
//
//   sluicectl status                 the node on one screen: agent, readiness, IPAM, endpoints,
//                                    Services, map fill levels, programs per interface, drops
//   sluicectl drops                  per-reason drop counters, summed over CPUs
//   sluicectl endpoints              the local endpoints the datapath delivers to, by pod
//   sluicectl nat                    masqueraded flows (pod tuple -> node address:port)
//   sluicectl services               Service frontends, flags, backend slots; names and why a
//                                    frontend serves nothing come from the agent
//   sluicectl ct list|flush|stats    conntrack entries of balanced and policy-tracked flows; counters
//   sluicectl identities             security identities, their labels and prefixes
//   sluicectl policy get NAMESPACE/POD
//                                    a local pod's enforced directions and allows
//   sluicectl observe [--last N] [--follow] [filters] [-o table|json]
//                                    flows from the agent's flow monitor (observe.cc)
//   sluicectl trace --from POD --to ADDR:PORT [--proto tcp|udp] [--flags S] [-o json]
//                                    one packet through the live program and maps, each
//                                    decision printed, its state taken back (trace.cc)
//   sluicectl bgp                    BGP sessions, prefixes advertised to and learned from each
//                                    (BIRD's control socket under --state_dir)
//   sluicectl config                 the running agent's configuration (every flag's value)
//   sluicectl version                this build's version and the running agent's
#include <cstdio>
#include <string>
#include <vector>

#include "agent/base/cli.h"
#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

namespace {

struct Command {
  const char* name;
  int (*run)();
};

constexpr Command kCommands[] = {
    {"status", sluice::ctl::Status},       {"drops", sluice::ctl::Drops},
    {"endpoints", sluice::ctl::Endpoints}, {"nat", sluice::ctl::Nat},
    {"services", sluice::ctl::Services},   {"identities", sluice::ctl::Identities},
    {"config", sluice::ctl::Config},       {"version", sluice::ctl::Version},
    {"bgp", sluice::ctl::Bgp},
};

constexpr char kUsage[] =
    "sluicectl [--bpffs_root=DIR] [--state_dir=DIR] [--agent=HOST:PORT] [-o json] COMMAND\n"
    "commands: status | drops | endpoints | nat | services | ct list|flush|stats | identities |\n"
    "          policy get NAMESPACE/POD | observe [options] | trace [options] |\n"
    "          bgp | config | version";

}  // namespace

namespace sluice::ctl {

int Version() {
  std::printf("%s\n", cli::VersionLine("sluicectl").c_str());
  auto config = AgentGet("/config");
  if (!config.ok()) {
    std::printf("sluice-agent: %s\n", std::string(config.status().message()).c_str());
    return 0;
  }
  auto j = nlohmann::json::parse(*config, nullptr, false);
  std::printf("sluice-agent %s\n", j.is_object() ? j.value("version", "?").c_str() : "?");
  return 0;
}

}  // namespace sluice::ctl

int main(int argc, char** argv) {
  // `observe` takes hubble's option spellings (--drop-reason, -o) and `trace` its own (--from,
  // --to), which are no absl flags: what follows the word is its own.
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    const std::string word = argv[i];
    if (word != "observe" && word != "trace") break;
    std::vector<std::string> rest(argv + i + 1, argv + argc);
    sluice::cli::ParseCommandLine(i, argv, "sluicectl", kUsage);
    return word == "observe" ? sluice::ctl::Observe(rest) : sluice::ctl::Trace(rest);
  }
  std::vector<char*> args = sluice::cli::ParseCommandLine(argc, argv, "sluicectl", kUsage);
  std::string cmd = args.size() > 1 ? args[1] : "";
  if (cmd == "policy") return sluice::ctl::Policy({args.begin() + 2, args.end()});
  if (cmd == "ct") return sluice::ctl::Conntrack({args.begin() + 2, args.end()});
  for (const Command& c : kCommands) {
    if (cmd == c.name) return c.run();
  }
  std::fprintf(stderr, "usage: %s\n", kUsage);
  return 2;
}
