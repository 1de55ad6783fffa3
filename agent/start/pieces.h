// What every feature's start function is handed (agent/<feature>/start.h): the pieces the agent
// builds once and the features share. main.cc builds them in order and wires the features in;
// each feature returns what it runs, and main holds it so that the agent stops in the reverse
// order of its start.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "agent/base/clock.h"

namespace sluice::loader {
class Datapath;
}
namespace sluice::metrics {
class AgentReadiness;
class Registry;
}  // namespace sluice::metrics

namespace sluice::agent {

class KubernetesState;
class Netlink;

struct StartPieces {
  const Clock* clock = RealClock::Get();
  metrics::Registry* registry = nullptr;  // where the features' collectors go
  metrics::AgentReadiness* ready = nullptr;
  KubernetesState* k8s = nullptr;  // null without Kubernetes
  Netlink* netlink = nullptr;
  loader::Datapath* datapath = nullptr;
  std::string node_name;  // the Node's name, or the host's without Kubernetes
  std::string state_dir;  // --state_dir: IPAM, endpoint records, the features' state files
};

// A start step that failed, as the agent logs it before it exits: "<what>: <status>", e.g.
// "--monitor_events: INVALID_ARGUMENT: unknown event type x". The code stays the cause's.
inline absl::Status StartError(const absl::Status& cause, absl::string_view what) {
  return absl::Status(cause.code(), absl::StrCat(what, ": ", cause.ToString()));
}

}  // namespace sluice::agent
