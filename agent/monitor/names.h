// Names for flows: pod namespace/name of each address (the Kubernetes Pod store, and the local
// endpoint store, which also knows pods without an apiserver), the Service of a translation
// (its frontend's rev_nat_id, read back from sluice_lb4_rnat) or of a frontend a flow was sent
// to, and interface names. Indexes are rebuilt from the stores at most once per `refresh`.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/k8s/model.h"
#include "agent/k8s/store.h"
#include "agent/monitor/flow.h"
#include "maps/lb.h"

namespace sluice::monitor {

struct NameSources {
  const k8s::Store<k8s::Pod>* pods = nullptr;          // optional
  const k8s::Store<k8s::Service>* services = nullptr;  // optional
  const agent::EndpointStore* endpoints = nullptr;     // optional
  // The frontend a rev_nat_id stands for (sluice_lb4_rnat); optional.
  std::function<std::optional<sluice_lb4_revnat>(uint32_t)> rev_nat;
  // if_indextoname on this node; optional.
  std::function<std::string(uint32_t)> interface_name;
  absl::Duration refresh = absl::Seconds(1);
  const Clock* clock = RealClock::Get();  // times the refresh; borrowed
};

class FlowNames {
 public:
  explicit FlowNames(NameSources sources) : sources_(std::move(sources)) {}

  // Fills in what the stores know: pods of source, destination and backend, the Service, the
  // interface name. Thread-safe.
  void Name(Flow& flow) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Named {
    std::string namespace_;
    std::string name;
  };
  void RefreshLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NamePeerLocked(FlowPeer& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The Service of frontend ip:port (a ClusterIP, external or LoadBalancer IP port, or any
  // address's NodePort).
  const Named* ServiceOfLocked(const std::string& ip, uint16_t port, const std::string& proto)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NameSources sources_;
  absl::Mutex mu_;
  absl::Time built_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::flat_hash_map<std::string, Named> pod_by_ip_ ABSL_GUARDED_BY(mu_);
  // "ip:port/proto" and "*:nodeport/proto" -> Service
  absl::flat_hash_map<std::string, Named> service_by_frontend_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, std::string> interfaces_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::monitor
