// What kube-apiserver and kube-controller-manager would do for the lab: Service defaulting and
// ClusterIP / NodePort allocation (admission, synchronous with the write), Node pod CIDR
// allocation, the EndpointSlice controller and the end of graceful pod deletion (asynchronous,
// driven by store events).
#ifndef SLUICE_AGENT_LAB_CONTROLLERS_CONTROLLERS_H_
#define SLUICE_AGENT_LAB_CONTROLLERS_CONTROLLERS_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/lab/store/object_store.h"
#include "nlohmann/json.hpp"

namespace sluice::lab {

struct ControllerOptions {
  std::string service_cidr = "10.96.0.0/16";  // .1 is the `kubernetes` Service
  std::string cluster_cidr = "10.244.0.0/16";
  int node_cidr_mask = 24;
  // kube-controller-manager --allocate-node-cidrs: false leaves Node spec.podCIDR to someone
  // else (sluice-operator's cluster-pool IPAM in `sluice-lab up --no-agents`).
  bool allocate_node_cidrs = true;
  int node_port_min = 30000;
  int node_port_max = 32767;
};

// IPv4 "a.b.c.d/n" -> (network, prefix length).
absl::StatusOr<std::pair<uint32_t, int>> ParseIpv4Cidr(std::string_view cidr);
std::string FormatIpv4(uint32_t ip);
absl::StatusOr<uint32_t> ParseIpv4(std::string_view ip);

// Service defaults and allocations, as kube-apiserver's service REST strategy does them:
// type ClusterIP, sessionAffinity None, ports' protocol TCP and targetPort = port, ipFamilies;
// spec.clusterIP(s) from the service CIDR unless headless ("None") or ExternalName;
// nodePorts for NodePort / LoadBalancer (requested ones are checked: 422 when taken or out of
// range); healthCheckNodePort for LoadBalancer + externalTrafficPolicy Local. Everything is
// released when the Service goes away or stops needing it.
class ServiceAdmission : public Admission {
 public:
  static absl::StatusOr<std::unique_ptr<ServiceAdmission>> Create(const ControllerOptions& options);
  absl::Status Admit(const ResourceType& type, nlohmann::json& object,
                     const nlohmann::json* old) override;
  void Deleted(const ResourceType& type, const nlohmann::json& object) override;

  size_t allocated_cluster_ips() const { return used_ips_.size(); }
  size_t allocated_node_ports() const { return used_node_ports_.size(); }

 private:
  ServiceAdmission(const ControllerOptions& options, uint32_t network, int prefix);
  absl::Status AdmitService(nlohmann::json& service, const nlohmann::json* old);

  ControllerOptions options_;
  uint32_t network_;
  uint32_t size_;
  uint32_t ip_cursor_;
  int port_cursor_;
  std::set<uint32_t> used_ips_;  // offsets into the service CIDR
  std::set<int> used_node_ports_;
};

// Desired EndpointSlices of one Service (pure; exposed for tests): one slice per distinct set of
// resolved ports, each with the endpoints of the selected pods that have a podIP.
std::vector<nlohmann::json> DesiredEndpointSlices(const nlohmann::json& service,
                                                  const std::vector<nlohmann::json>& pods);

// The asynchronous controllers. Construct before the store is shared (it adds a store listener);
// Start() runs them on a thread.
class Controllers {
 public:
  Controllers(ObjectStore* store, ControllerOptions options);
  ~Controllers();
  Controllers(const Controllers&) = delete;
  Controllers& operator=(const Controllers&) = delete;

  absl::Status Start();
  void Stop();
  // Re-evaluates deadlines now (FakeClock observers call this).
  void Wake();
  // One full pass on the caller's thread: every Node, every Service, expired terminating pods.
  void SyncAll();

  // Creates the default, kube-system and kube-public Namespaces and the `kubernetes` Service
  // (first address of the service CIDR, port 443 -> `apiserver_port`), with an EndpointSlice to
  // `apiserver_ip` when it is set.
  static absl::Status Bootstrap(ObjectStore* store, const ControllerOptions& options,
                                const std::string& apiserver_ip, int apiserver_port);

 private:
  void OnEvent(const Event& event);  // store lock held
  void Run();
  void SyncService(const std::string& ns, const std::string& name);
  void SyncNamespacePods(const std::string& ns, const std::vector<nlohmann::json>& label_sets);
  void AllocatePodCidr(const std::string& node);

  ObjectStore* store_;
  ControllerOptions options_;
  uint32_t cluster_network_ = 0;
  int cluster_prefix_ = 16;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool wake_ = false;
  std::set<std::pair<std::string, std::string>> dirty_services_;
  std::map<std::string, std::vector<nlohmann::json>> dirty_pods_;  // ns -> label sets
  std::set<std::string> dirty_nodes_;
  std::thread thread_;
};

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_CONTROLLERS_CONTROLLERS_H_
