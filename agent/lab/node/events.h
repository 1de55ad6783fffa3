// core/v1 Events as the lab's kubelet and scheduler report them (client-go's event recorder and
// its correlator, in small): an Event names the object it is about (involvedObject), a reason
// and a message; a repeat of a recent one (same object, type, reason, message and source) bumps
// that Event's count and lastTimestamp instead of adding another, so a pod whose sandbox keeps
// failing shows one Warning "x5 over 10s". At most `limit` recorded Events are kept: the oldest
// is deleted when a new one would exceed it (kube-apiserver expires Events by a TTL instead).
#ifndef SLUICE_AGENT_LAB_NODE_EVENTS_H_
#define SLUICE_AGENT_LAB_NODE_EVENTS_H_

#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "agent/lab/store/object_store.h"
#include "nlohmann/json.hpp"

namespace sluice::lab {

struct EventSource {
  std::string component;  // "kubelet", "default-scheduler"
  std::string host;       // the node, for the kubelet
};

class EventRecorder {
 public:
  static constexpr size_t kDefaultLimit = 1000;
  explicit EventRecorder(ObjectStore* store, size_t limit = kDefaultLimit)
      : store_(store), limit_(limit) {}

  // An Event about `object` (a Pod, a Node, ...; its kind, namespace, name, uid and
  // resourceVersion); `type` is "Normal" or "Warning"; `field_path` names a part of it
  // ("spec.containers{app}") or is empty. Cluster-scoped objects' Events go to "default".
  absl::Status Record(const nlohmann::json& object, const std::string& type,
                      const std::string& reason, const std::string& message,
                      const EventSource& source, const std::string& field_path = "");

  size_t size() const;  // Events recorded and still kept

 private:
  ObjectStore* store_;
  const size_t limit_;
  mutable std::mutex mu_;
  // Correlation key -> "namespace/name" of the Event that aggregates it.
  std::map<std::string, std::string> by_key_;
  std::deque<std::pair<std::string, std::string>> order_;  // (key, namespace/name), oldest first
  int64_t last_suffix_ = 0;  // names stay unique when the clock stands still
};

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_NODE_EVENTS_H_
