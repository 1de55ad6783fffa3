// sluice-lab: a whole Kubernetes cluster on this machine — an embedded control plane and N nodes
// as network namespaces, each running the real sluice-agent — plus the tools tests use against it
// (probe, request, exec, fault), the pods' test server (netexec) and a standalone apiserver
// (serve).
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/base/cli.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/lab.h"
#include "agent/lab/network/netexec.h"
#include "agent/lab/network/probe.h"
#include "agent/lab/network/topology.h"
#include "agent/lab/tools/process.h"
#include "agent/lab/workloads/workloads.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::lab {
namespace {

constexpr char kUsage[] =
    R"(sluice-lab: a Kubernetes cluster on this machine (network namespaces, real sluice-agents)

usage:
  sluice-lab --version | --help
  sluice-lab up [--nodes N] [--name NAME] [--no-agents] [--bgp]
                                             create a lab (2 nodes, name "lab" by default);
                                             prints the kubeconfig path once every agent is ready;
                                             --no-agents: nodes without agents or pod CIDRs,
                                             NotReady until Sluice is installed from the Helm
                                             chart (kubectl apply; docs/lab.md);
                                             --bgp: a router running FRR on the underlay and a
                                             client behind it (--from client); the agents
                                             peer with it (docs/routing.md, "BGP")
  sluice-lab down [--name NAME]              stop it and remove everything it made
  sluice-lab status [--name NAME]            nodes, pod CIDRs, agents, pods
  sluice-lab kubeconfig [--name NAME]        print the kubeconfig path
  sluice-lab exec [--name NAME] POD [-n NAMESPACE] -- CMD [ARG...]
                                             run CMD in a pod's network namespace
                                             (POD may also be node/NODE or external)
  sluice-lab probe [--name NAME] --from FROM --to HOST:PORT [--proto tcp|udp] [--timeout S]
                                             prints CONNECTED, REFUSED, TIMEOUT or UNREACHABLE
                                             (EHOSTUNREACH/ENETUNREACH) and exits 0, 3, 4 or 5
                                             (1: error, 2: usage); with --to HOST:PORT,... probes
                                             them all at once, prints "HOST:PORT OUTCOME" per
                                             target and exits 0 only if all are CONNECTED, else
                                             with the code of the first that is not
  sluice-lab request [--name NAME] --from FROM --to HOST:PORT --data TEXT [--proto tcp|udp]
                     [--timeout S]           prints the reply (one line), or REFUSED / TIMEOUT /
                                             UNREACHABLE (exit 0 in every case)
  sluice-lab fault [--name NAME | --kubeconfig K] ACTION [--seconds S] [--count N]
                   [--mid_event] [--at_next_event]
                                             apiserver fault injection; ACTION: cut-watches,
                                             expire-watches, stall, go-away, compact
  sluice-lab agent [--name NAME] ACTION --node NODE [--wait]
                                             one node's agent, supervised by the lab as a
                                             DaemonSet's pod is (restarted on exit, with
                                             back-off); ACTION: kill (SIGKILL), restart
                                             (SIGTERM), stop (held down until start), start;
                                             --wait: until the new agent process runs
  sluice-lab restart-agent [--name NAME] NODE
                                             agent restart --node NODE --wait: prints
                                             "OLD_PID -> NEW_PID" once the new agent runs
  sluice-lab sluicectl [--name NAME] NODE [--] [SLUICECTL ARGS...]
                                             sluicectl inside a node (its network namespace,
                                             where its agent answers): it reads that node's
                                             maps, records and flows (sluicectl --node NODE)
  sluice-lab serve [--listen A] [--port P] [--kubeconfig K] [--token T] [--verbose]
                                             only the apiserver (no nodes), until SIGTERM
  sluice-lab netexec --port P --name NAME [--tcp] [--udp]
                                             the pods' test server: "hostname", "clientip", echo
  sluice-lab controlplane --name NAME [--no_agents]
                                             (internal) the lab's daemon, started by `up`
  sluice-lab container --spec FILE [-- ARGV...]
                                             (internal) one container of a pod of the Sluice
                                             image, in its own mount namespace

Every command but --help, --version, serve and netexec runs as root (network namespaces, bpffs
mounts, /run/sluice-lab).
FROM is external, client (up --bgp), node/NODE (node1, node2, ...) or NAMESPACE/POD (POD alone:
namespace default).
--name defaults to the only lab present. Pods are netexec servers on their containerPorts; the
annotation lab.sluice.dev/ready: "false" keeps a pod running but not Ready.
)";

struct Args {
  std::vector<std::string> positional;
  std::vector<std::string> after_dashes;
  std::map<std::string, std::string> values;
  std::set<std::string> switches;
};

// --key value, --key=value, -n value; the switches named in `bools` take no value. Dashes in
// keys are read as underscores (--mid-event == --mid_event).
absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& in,
                               const std::set<std::string>& bools) {
  Args a;
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string& s = in[i];
    if (s == "--") {
      a.after_dashes.assign(in.begin() + i + 1, in.end());
      break;
    }
    if (s.size() > 1 && s[0] == '-') {
      std::string key = s.substr(s[1] == '-' ? 2 : 1);
      std::string value;
      bool has_value = false;
      if (auto eq = key.find('='); eq != std::string::npos) {
        value = key.substr(eq + 1);
        key = key.substr(0, eq);
        has_value = true;
      }
      for (char& c : key) {
        if (c == '-') c = '_';
      }
      if (bools.contains(key)) {
        if (!has_value || value == "true" || value == "1") a.switches.insert(key);
      } else if (has_value) {
        a.values[key] = value;
      } else if (i + 1 < in.size()) {
        a.values[key] = in[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(s, " needs a value"));
      }
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

int UsageError(const std::string& message) {
  std::cerr << "sluice-lab: " << message << "\n\n" << kUsage;
  return 2;
}

int Fail(const absl::Status& st) {
  std::cerr << "sluice-lab: " << st.message() << "\n";
  return 1;
}

std::string Get(const Args& a, const std::string& key, const std::string& def = "") {
  auto it = a.values.find(key);
  return it == a.values.end() ? def : it->second;
}

int CmdUp(const Args& a) {
  UpOptions o;
  o.name = Get(a, "name", "lab");
  if (!absl::SimpleAtoi(Get(a, "nodes", "2"), &o.nodes)) return UsageError("--nodes: a number");
  o.no_agents = a.switches.contains("no_agents");
  o.bgp = a.switches.contains("bgp");
  auto kubeconfig = Up(o, SelfExe());
  if (!kubeconfig.ok()) return Fail(kubeconfig.status());
  std::cout << *kubeconfig << std::endl;
  return 0;
}

sigset_t BlockStopSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before any thread starts
  return stop;
}

int CmdNetexec(const Args& a) {
  NetexecOptions o;
  if (!absl::SimpleAtoi(Get(a, "port"), &o.port)) return UsageError("netexec: --port P");
  o.name = Get(a, "name");
  if (o.name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    o.name = host;
  }
  if (a.switches.contains("tcp") || a.switches.contains("udp")) {
    o.tcp = a.switches.contains("tcp");
    o.udp = a.switches.contains("udp");
  }
  o.log_requests = true;
  sigset_t stop = BlockStopSignals();
  auto server = NetexecServer::Start(o);
  if (!server.ok()) return Fail(server.status());
  spdlog::info("netexec {} serving port {}{}{}", o.name, o.port, o.tcp ? " tcp" : "",
               o.udp ? " udp" : "");
  int sig = 0;
  sigwait(&stop, &sig);
  (*server)->Stop();
  return 0;
}

// The apiserver alone, on an address of the root namespace.
int CmdServe(const Args& a) {
  if (a.switches.contains("verbose")) spdlog::set_level(spdlog::level::debug);
  ApiServerOptions o;
  o.address = Get(a, "listen", "127.0.0.1");
  if (!absl::SimpleAtoi(Get(a, "port", "6443"), &o.port)) return UsageError("--port P");
  o.token = Get(a, "token");
  sigset_t stop = BlockStopSignals();
  ApiServer server(o);
  if (auto st = server.Start(); !st.ok()) return Fail(st);
  if (std::string path = Get(a, "kubeconfig"); !path.empty()) {
    if (auto st = server.WriteKubeconfig(path); !st.ok()) return Fail(st);
    spdlog::info("sluice-lab: kubeconfig written to {}", path);
  }
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("sluice-lab: signal {}, stopping", sig);
  server.Stop();
  return 0;
}

int CmdFault(const Args& a) {
  if (a.positional.size() != 1) return UsageError("fault ACTION");
  std::string kubeconfig = Get(a, "kubeconfig");
  if (kubeconfig.empty()) {
    auto lab = ResolveLab(Get(a, "name"));
    if (!lab.ok()) return Fail(lab.status());
    kubeconfig = KubeconfigPath(*lab);
  }
  double seconds = 5;
  int count = 1;
  if (!absl::SimpleAtod(Get(a, "seconds", "5"), &seconds)) return UsageError("--seconds S");
  if (!absl::SimpleAtoi(Get(a, "count", "1"), &count)) return UsageError("--count N");
  nlohmann::json body = {{"action", a.positional[0]},
                         {"midEvent", a.switches.contains("mid_event")},
                         {"atNextEvent", a.switches.contains("at_next_event")},
                         {"count", count},
                         {"seconds", seconds}};
  auto r = Fault(kubeconfig, body);
  if (!r.ok()) return Fail(r.status());
  std::cout << *r << std::endl;
  return 0;
}

// probe / request: resolve --from in the lab, join that namespace, make one attempt.
int CmdProbe(const Args& a, bool request) {
  auto lab = ResolveLab(Get(a, "name"));
  if (!lab.ok()) return Fail(lab.status());
  auto t = LoadTopology(*lab);
  if (!t.ok()) return Fail(t.status());
  if (Get(a, "from").empty() || Get(a, "to").empty()) {
    return UsageError("--from and --to are required");
  }
  auto proto = ParseProtocol(Get(a, "proto", "tcp"));
  if (!proto.ok()) return UsageError(std::string(proto.status().message()));
  double seconds = 3;
  if (!absl::SimpleAtod(Get(a, "timeout", "3"), &seconds) || seconds <= 0) {
    return UsageError("--timeout: seconds");
  }
  std::vector<ProbeTarget> targets;
  for (absl::string_view to : absl::StrSplit(Get(a, "to"), ',')) {
    ProbeTarget target;
    if (auto st = ParseHostPort(std::string(to), &target); !st.ok()) {
      return UsageError(std::string(st.message()));
    }
    target.protocol = *proto;
    target.timeout = absl::Seconds(seconds);
    targets.push_back(target);
  }
  if (request && targets.size() != 1) return UsageError("request: one --to HOST:PORT");
  const ProbeTarget& target = targets.front();
  if (request && !a.values.contains("data")) return UsageError("request: --data TEXT");
  auto netns = ResolveNetns(*t, Get(a, "from"));
  if (!netns.ok()) return Fail(netns.status());
  if (auto st = EnterNetns(*netns); !st.ok()) return Fail(st);
  if (!request && targets.size() > 1) {
    auto outcomes = ProbeAll(targets);
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!outcomes[i].ok()) return Fail(outcomes[i].status());
    }
    // Exit status: 0 when every target is CONNECTED, else that of the first one that is not.
    int code = 0;
    for (size_t i = 0; i < targets.size(); ++i) {
      std::cout << targets[i].host << ":" << targets[i].port << " "
                << ProbeOutcomeName(*outcomes[i]) << "\n";
      if (code == 0) code = ProbeExitCode(*outcomes[i]);
    }
    std::cout << std::flush;
    return code;
  }
  if (!request) {
    auto outcome = Probe(target);
    if (!outcome.ok()) return Fail(outcome.status());
    std::cout << ProbeOutcomeName(*outcome) << std::endl;
    return ProbeExitCode(*outcome);
  }
  auto r = Request(target, Get(a, "data"));
  if (!r.ok()) return Fail(r.status());
  if (r->outcome != ProbeOutcome::kConnected) {
    std::cout << ProbeOutcomeName(r->outcome) << std::endl;
    return 0;
  }
  std::string reply = r->reply;
  while (!reply.empty() && (reply.back() == '\n' || reply.back() == '\r')) reply.pop_back();
  for (char& c : reply) {
    if (c == '\n') c = ' ';
  }
  std::cout << reply << std::endl;
  return 0;
}

int CmdExec(const Args& a) {
  if (a.positional.size() != 1 || a.after_dashes.empty()) {
    return UsageError("exec POD [-n NAMESPACE] -- CMD...");
  }
  auto lab = ResolveLab(Get(a, "name"));
  if (!lab.ok()) return Fail(lab.status());
  auto t = LoadTopology(*lab);
  if (!t.ok()) return Fail(t.status());
  std::string target = a.positional[0];
  if (target != "external" && target != "client" && target.rfind("node/", 0) != 0) {
    target = Get(a, "n", Get(a, "namespace", "default")) + "/" + target;
  }
  auto netns = ResolveNetns(*t, target);
  if (!netns.ok()) return Fail(netns.status());
  if (auto st = EnterNetns(*netns); !st.ok()) return Fail(st);
  std::vector<char*> argv;
  for (const auto& s : a.after_dashes) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  perror(argv[0]);
  return 127;
}

int CmdAgent(const Args& a) {
  if (a.positional.size() != 1 || Get(a, "node").empty()) {
    return UsageError("agent ACTION --node NODE");
  }
  auto lab = ResolveLab(Get(a, "name"));
  if (!lab.ok()) return Fail(lab.status());
  auto r = AgentAction(*lab, Get(a, "node"), a.positional[0], a.switches.contains("wait"));
  if (!r.ok()) return Fail(r.status());
  std::cout << *r << std::endl;
  return 0;
}

int CmdRestartAgent(const Args& a) {
  if (a.positional.size() != 1) return UsageError("restart-agent NODE");
  auto lab = ResolveLab(Get(a, "name"));
  if (!lab.ok()) return Fail(lab.status());
  auto r = AgentAction(*lab, a.positional[0], "restart", /*wait=*/true);
  if (!r.ok()) return Fail(r.status());
  std::cout << *r << std::endl;
  return 0;
}

// `sluice-lab sluicectl NODE ARGS...`: the node's network namespace, then sluicectl (beside
// this binary as the build lays them out, or $SLUICE_LAB_SLUICECTL). There its agent answers on
// its health address, and sluicectl learns the node's bpffs root, state directory and sockets
// from it.
int CmdSluicectl(const Args& a) {
  if (a.positional.size() != 1) return UsageError("sluicectl NODE [--] [ARGS...]");
  auto lab = ResolveLab(Get(a, "name"));
  if (!lab.ok()) return Fail(lab.status());
  auto t = LoadTopology(*lab);
  if (!t.ok()) return Fail(t.status());
  const LabNode* node = t->FindNode(a.positional[0]);
  if (node == nullptr) {
    std::string nodes;
    for (const LabNode& n : t->nodes) absl::StrAppend(&nodes, nodes.empty() ? "" : ", ", n.name);
    return Fail(absl::NotFoundError(
        absl::StrCat("lab ", *lab, " has no node ", a.positional[0], " (nodes: ", nodes, ")")));
  }
  if (auto st = EnterNetns(node->netns_path()); !st.ok()) return Fail(st);
  std::vector<std::string> words = {SluicectlBinary()};
  words.insert(words.end(), a.after_dashes.begin(), a.after_dashes.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  return Fail(
      absl::NotFoundError(absl::StrCat("cannot run ", words[0], ": ", std::strerror(errno),
                                       " (set SLUICE_LAB_SLUICECTL to the sluicectl binary)")));
}

// The commands that take no positional argument: a stray word is refused, not ignored.
bool TakesNoPositional(const std::string& cmd) {
  static const std::set<std::string> kNone = {"up",           "down",     "status", "kubeconfig",
                                              "serve",        "netexec",  "probe",  "request",
                                              "controlplane", "container"};
  return kNone.contains(cmd);
}

int Main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help" ||
      std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") {
    std::cout << cli::VersionLine("sluice-lab") << "\n";
    return 0;
  }
  std::vector<std::string> rest(argv + 2, argv + argc);
  if (cmd == "sluicectl") {
    // sluice-lab sluicectl [--name LAB] NODE [--] ARGS...: what follows NODE is sluicectl's own,
    // flags included, so only the words up to NODE are this command's.
    Args own;
    size_t k = 0;
    while (k < rest.size() && rest[k].size() > 1 && rest[k][0] == '-' && rest[k] != "--") {
      const std::string flag = rest[k++];
      if ((flag == "--name" || flag == "-name") && k < rest.size()) {
        own.values["name"] = rest[k++];
      } else if (flag.rfind("--name=", 0) == 0) {
        own.values["name"] = flag.substr(7);
      } else {
        return UsageError(absl::StrCat("sluicectl: ", flag, " before NODE (only --name)"));
      }
    }
    if (k < rest.size()) own.positional.push_back(rest[k++]);
    if (k < rest.size() && rest[k] == "--") ++k;
    own.after_dashes.assign(rest.begin() + k, rest.end());
    return CmdSluicectl(own);
  }
  auto args = ParseArgs(rest, {"tcp", "udp", "help", "mid_event", "at_next_event", "verbose",
                               "wait", "no_agents", "bgp"});
  if (!args.ok()) return UsageError(std::string(args.status().message()));
  const Args& a = *args;
  if (a.switches.contains("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (TakesNoPositional(cmd) && !a.positional.empty()) {
    return UsageError(absl::StrCat(cmd, ": unexpected argument '", a.positional[0], "'"));
  }
  if (cmd == "up") return CmdUp(a);
  if (cmd == "netexec") return CmdNetexec(a);
  if (cmd == "serve") return CmdServe(a);
  if (cmd == "fault") return CmdFault(a);
  if (cmd == "probe") return CmdProbe(a, false);
  if (cmd == "request") return CmdProbe(a, true);
  if (cmd == "exec") return CmdExec(a);
  if (cmd == "agent") return CmdAgent(a);
  if (cmd == "restart-agent") return CmdRestartAgent(a);
  if (cmd == "controlplane") {
    if (Get(a, "name").empty()) return UsageError("controlplane --name NAME");
    return RunControlPlane(Get(a, "name"), a.switches.contains("no_agents"));
  }
  if (cmd == "container") {
    if (Get(a, "spec").empty()) return UsageError("container --spec FILE [-- ARGV...]");
    return RunContainer(Get(a, "spec"), a.after_dashes);
  }
  if (cmd != "down" && cmd != "status" && cmd != "kubeconfig") {
    return UsageError(absl::StrCat("unknown command ", cmd));
  }
  auto lab = ResolveLab(Get(a, "name"));
  if (!lab.ok()) return Fail(lab.status());
  if (cmd == "down") {
    if (auto st = Down(*lab); !st.ok()) return Fail(st);
    return 0;
  }
  if (cmd == "status") {
    auto s = Status(*lab);
    if (!s.ok()) return Fail(s.status());
    std::cout << *s;
    return 0;
  }
  std::cout << KubeconfigPath(*lab) << std::endl;
  return 0;
}

}  // namespace
}  // namespace sluice::lab

int main(int argc, char** argv) {
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  // A filesystem refusal deep in `up` (a user who is not root) is an answer, not an abort.
  try {
    return sluice::lab::Main(argc, argv);
  } catch (const std::filesystem::filesystem_error& e) {
    const bool denied =
        e.code() == std::errc::permission_denied || e.code() == std::errc::operation_not_permitted;
    std::cerr << "sluice-lab: " << e.what()
              << (denied ? "; sluice-lab runs as root: it creates network namespaces, mounts "
                           "bpffs and writes under /run/sluice-lab"
                         : "")
              << "\n";
    return 1;
  }
}
