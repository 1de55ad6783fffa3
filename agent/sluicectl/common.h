// What every sluicectl subcommand shares: the --bpffs_root, --state_dir, --agent and -o flags,
// opening pinned maps, asking the running agent (its health server), naming pods from the
// agent's endpoint records, and how addresses, MACs and protocols are printed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "agent/endpoint/endpoint_store.h"
#include "maps/sluice_maps.h"
#include "nlohmann/json_fwd.hpp"

ABSL_DECLARE_FLAG(std::string, bpffs_root);
ABSL_DECLARE_FLAG(std::string, state_dir);
ABSL_DECLARE_FLAG(std::string, agent);
ABSL_DECLARE_FLAG(std::string, o);
ABSL_DECLARE_FLAG(std::string, pod);
ABSL_DECLARE_FLAG(std::string, service);

namespace sluice::ctl {

std::string Ip(uint32_t be);        // network-order IPv4 -> "10.0.0.1"
std::string Mac(const uint8_t* m);  // "aa:bb:cc:dd:ee:ff"
const char* Proto(uint8_t p);       // "tcp", "udp", "icmp", "?"
uint64_t NowNs();                   // CLOCK_MONOTONIC ns: the datapath's timestamps' clock

// -o json: every list prints one JSON document instead of its table.
bool JsonOutput();
void PrintJson(const nlohmann::json& j);

// A refusal (EPERM, EACCES) followed by what sluicectl needs: root, or CAP_BPF and access to
// the pinned maps and the agent's state directory.
std::string ExplainPermission(const absl::Status& status);

// Opens the pinned map `name` under --bpffs_root, or exits 1 with the reason.
template <typename M>
M OpenOrDie(const char* name) {
  auto m = M::Open(maps::PinPath(absl::GetFlag(FLAGS_bpffs_root), name));
  if (!m.ok()) {
    std::fprintf(stderr, "sluicectl: %s\n", ExplainPermission(m.status()).c_str());
    std::exit(1);
  }
  return std::move(*m);
}

// Where this node's agent keeps its maps, records and sockets: sluicectl asks the running agent
// (GET /config on --agent) and takes its --bpffs_root, --state_dir and --observe_socket for every
// one of those the command line does not set (`explicit_flags`: the names given there). Where no
// agent answers, the flags keep their defaults, and AgentNotReached() says so and what to pass.
void LearnNodeFromAgent(const std::vector<std::string>& explicit_flags);
// Empty when the agent answered (or every path was given); else one sentence for stderr: which
// agent did not answer, which defaults are being read instead, and what to pass.
const std::string& AgentNotReached();
// Whether --state_dir is a fact (given, or the agent's own) rather than an unconfirmed default:
// a count read from a directory that may not be the agent's is no count.
bool StateDirKnown();
// The agent's --observe_socket (learnt as above), else the monitor's default.
std::string ObserveSocket();

// GET `path` from the agent's health server (--agent): the body of a 200 or 503 reply, with
// the status in *status; an error when the agent does not answer.
absl::StatusOr<std::string> AgentGet(const std::string& path, int* status = nullptr);

// --pod=NAMESPACE/NAME (endpoints, nat, ct list) and --service=NAMESPACE/NAME
// (services): empty matches everything.
bool PodSelected(const std::string& pod_name);
bool ServiceSelected(const std::string& service_port);  // "default/web:http" matches default/web
// A list filtered by a pod that is not on this node would print nothing, which reads as "no
// entries": --pod must name a pod of this node's endpoint records, or this prints why to stderr
// and returns false (the command then exits 1).
bool PodFlagNamesALocalPod();

// The agent's endpoint records under --state_dir (one per pod interface on this node), read
// without opening its store (which tidies the directory); unreadable records are skipped. *ec
// (when given) tells whether the directory itself could be read.
std::vector<agent::Endpoint> EndpointRecords(std::error_code* ec = nullptr);
// "namespace/name" of a record, "(no pod name)" when it has none.
std::string PodName(const agent::Endpoint& ep);
// Pod names by address ("10.244.0.5" -> "default/web-1") from the endpoint records.
std::map<std::string, std::string> PodNamesByAddress();

// A loaded program's name by id ("sluice_from_pod"), or "prog ID" (status.cc).
std::string ProgName(uint32_t id);

// Identity number -> its labels ("k8s:app=web,..."), reserved ones included (policy.cc).
std::map<uint32_t, std::string> IdentityNames();
// The agent's <state_dir>/policy-status.json (agent/policy/sync.h): endpoints that keep their last
// complete policy ("degraded") and policies with parts it cannot translate ("invalid"); null when
// absent or unreadable.
nlohmann::json LoadPolicyStatus();

// The subcommands; each returns the process exit code.
int Bgp();
int Drops();
int Endpoints();
int Nat();
int Services();
int Identities();
int Policy(const std::vector<std::string>& args);     // args after "policy"
int Observe(const std::vector<std::string>& args);    // args after "observe" (its own options)
int Conntrack(const std::vector<std::string>& args);  // args after "ct": list | flush
int Trace(const std::vector<std::string>& args);      // args after "trace" (its own options)
int Status();
int Config();
int Version();

}  // namespace sluice::ctl
