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
//   sluicectl ct list|flush|stats    conntrack entries of balanced and policy-tracked flows;
//                                    counters
//   sluicectl identities             security identities, their labels and prefixes
//   sluicectl policy get [NAMESPACE/]POD
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
//
// sluicectl finds its node by itself: the running agent (--agent) tells it its --bpffs_root,
// --state_dir and observe socket, unless the command line sets them. Where no agent answers it
// says so, and what to pass. In a sluice-lab, --node NODE runs it inside that node (through
// `sluice-lab sluicectl NODE`); in a cluster it runs in the agent's pod (kubectl exec).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "agent/base/cli.h"
#include "agent/base/version.h"
#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, node, "",
          "in a sluice-lab: run inside this node (its network namespace, where its agent "
          "answers), as `sluice-lab sluicectl NODE` does");
ABSL_FLAG(std::string, lab, "", "with --node: the lab's name (default: the only lab present)");

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
    "sluicectl [--node NODE [--lab NAME]] [--agent=HOST:PORT] [--bpffs_root=DIR]\n"
    "          [--state_dir=DIR] [-o json] COMMAND\n"
    "commands: status | drops | endpoints | nat | services | ct list|flush|stats | identities |\n"
    "          policy get [NAMESPACE/]POD | observe [options] | trace [options] |\n"
    "          bgp | config | version\n"
    "The running agent (--agent) tells sluicectl its --bpffs_root, --state_dir and observe\n"
    "socket; flags given here win. In a sluice-lab, --node NODE runs inside that node.";

// The flags named on the command line ("bpffs_root", ...).
std::vector<std::string> ExplicitFlags(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '-') continue;
    std::string name = argv[i];
    name.erase(0, name.find_first_not_of('-'));
    out.push_back(name.substr(0, name.find('=')));
  }
  return out;
}

// --node: the same command line, run by `sluice-lab sluicectl [--name LAB] NODE` inside the
// node. sluice-lab is $SLUICE_LAB_BINARY, else beside this binary as the build and the image lay
// them out, else on $PATH.
int RunInLabNode(int argc, char** argv) {
  std::string lab_binary = "sluice-lab";
  if (const char* env = std::getenv("SLUICE_LAB_BINARY"); env != nullptr && *env != '\0') {
    lab_binary = env;
  } else {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    for (const char* relative : {"lab/sluice-lab", "sluice-lab"}) {
      const std::filesystem::path candidate = self.parent_path() / relative;
      if (!ec && access(candidate.c_str(), X_OK) == 0) {
        lab_binary = candidate.string();
        break;
      }
    }
  }
  std::vector<std::string> words = {lab_binary, "sluicectl"};
  if (!absl::GetFlag(FLAGS_lab).empty()) words.push_back("--name=" + absl::GetFlag(FLAGS_lab));
  words.push_back(absl::GetFlag(FLAGS_node));
  words.push_back("--");
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string name = a.substr(0, a.find('='));
    if (name == "--node" || name == "-node" || name == "--lab" || name == "-lab") {
      if (a.find('=') == std::string::npos) ++i;  // its value is the next word
      continue;
    }
    words.push_back(a);
  }
  std::vector<char*> exec_argv;
  for (std::string& w : words) exec_argv.push_back(w.data());
  exec_argv.push_back(nullptr);
  execvp(exec_argv[0], exec_argv.data());
  std::fprintf(stderr, "sluicectl: --node: cannot run %s: %s (set SLUICE_LAB_BINARY)\n",
               lab_binary.c_str(), std::strerror(errno));
  return 1;
}

// Every command reads the node its agent reports; where no agent answered, stderr says which
// defaults were read instead and what to pass (observe, which reads no map, says it only when
// its socket does not answer either).
void FindNode(int argc, char** argv, bool warn = true) {
  sluice::ctl::LearnNodeFromAgent(ExplicitFlags(argc, argv));
  if (warn && !sluice::ctl::AgentNotReached().empty()) {
    std::fprintf(stderr, "sluicectl: %s\n", sluice::ctl::AgentNotReached().c_str());
  }
}

}  // namespace

namespace sluice::ctl {

int Version() {
  const bool json = JsonOutput();
  auto config = AgentGet("/config");
  nlohmann::json j;
  if (config.ok()) j = nlohmann::json::parse(*config, nullptr, false);
  const std::string agent_version = j.is_object() ? j.value("version", "") : "";
  if (json) {
    nlohmann::json out = {{"sluicectl", SLUICE_VERSION_STRING},
                          {"agent", {{"address", absl::GetFlag(FLAGS_agent)}}}};
    if (!agent_version.empty()) {
      out["agent"]["version"] = agent_version;
    } else {
      out["agent"]["error"] =
          config.ok() ? "no version in its answer" : std::string(config.status().message());
    }
    PrintJson(out);
    return 0;
  }
  std::printf("%s\n", cli::VersionLine("sluicectl").c_str());
  if (!config.ok()) {
    std::printf("sluice-agent: %s\n", std::string(config.status().message()).c_str());
    return 0;
  }
  std::printf("sluice-agent %s\n", agent_version.empty() ? "?" : agent_version.c_str());
  return 0;
}

}  // namespace sluice::ctl

int main(int argc, char** argv) {
  // `observe` takes hubble's option spellings (--drop-reason, -o) and `trace` its own (--from,
  // --to), which are no absl flags: what follows the word is its own.
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') {
      // Every flag of sluicectl takes a value: `-o json`'s is the next word, not the command.
      if (std::strchr(argv[i], '=') == nullptr) ++i;
      continue;
    }
    const std::string word = argv[i];
    if (word != "observe" && word != "trace") break;
    std::vector<std::string> rest(argv + i + 1, argv + argc);
    sluice::cli::ParseCommandLine(i, argv, "sluicectl", kUsage);
    if (!absl::GetFlag(FLAGS_node).empty()) return RunInLabNode(argc, argv);
    FindNode(i, argv, /*warn=*/word != "observe");
    return word == "observe" ? sluice::ctl::Observe(rest) : sluice::ctl::Trace(rest);
  }
  std::vector<char*> args = sluice::cli::ParseCommandLine(argc, argv, "sluicectl", kUsage);
  if (!absl::GetFlag(FLAGS_node).empty()) return RunInLabNode(argc, argv);
  std::string cmd = args.size() > 1 ? args[1] : "";
  if (cmd == "policy" || cmd == "ct") {
    FindNode(argc, argv);
    std::vector<std::string> rest(args.begin() + 2, args.end());
    return cmd == "policy" ? sluice::ctl::Policy(rest) : sluice::ctl::Conntrack(rest);
  }
  for (const Command& c : kCommands) {
    if (cmd != c.name) continue;
    // These take no words after their own: `sluicectl status foo` is a mistake, not status.
    if (args.size() > 2) return sluice::cli::RefuseArgument("sluicectl", args[2], kUsage);
    // config and version ask the agent itself and read nothing of the node.
    if (cmd != "config" && cmd != "version") FindNode(argc, argv);
    return c.run();
  }
  if (cmd.empty()) {
    std::fprintf(stderr, "usage: %s\n", kUsage);
    return 2;
  }
  return sluice::cli::RefuseArgument("sluicectl", cmd, kUsage);
}
