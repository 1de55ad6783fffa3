#include "agent/service/name_file.h"

#include "agent/base/files.h"
#include "nlohmann/json.hpp"

namespace sluice::agent {

void ServiceNameFile::Set(const std::string& key, const k8s::Service* service) {
  if (service == nullptr) {
    dirty_ |= entries_.erase(key) > 0;
    return;
  }
  nlohmann::json ports = nlohmann::json::array();
  for (const k8s::ServicePort& sp : service->ports) {
    ports.push_back({{"name", sp.name},
                     {"port", sp.port},
                     {"protocol", std::string(k8s::ProtocolName(sp.protocol))},
                     {"nodePort", sp.node_port}});
  }
  std::vector<std::string> external = service->external_ips;
  external.insert(external.end(), service->load_balancer_ingress_ips.begin(),
                  service->load_balancer_ingress_ips.end());
  std::string entry = nlohmann::json{
      {"namespace", service->meta.namespace_},
      {"name", service->meta.name},
      {"clusterIPs", service->cluster_ips},
      {"externalIPs", external},
      {"ports", ports}}.dump();
  auto [it, added] = entries_.try_emplace(key, entry);
  if (added || it->second != entry) {
    it->second = std::move(entry);
    dirty_ = true;
  }
}

std::string ServiceNameFile::Json() const {
  std::string out = "[";
  bool first = true;
  for (const auto& [key, entry] : entries_) {
    out += first ? "\n" : ",\n";
    out += entry;
    first = false;
  }
  out += "\n]\n";
  return out;
}

absl::Status ServiceNameFile::Flush() {
  if (!dirty_ || dir_.empty()) return absl::OkStatus();
  absl::Status st = WriteFileAtomically(dir_, kServiceNamesFile, Json(), 0600);
  if (st.ok()) {
    dirty_ = false;
    ++writes_;
  }
  return st;
}

}  // namespace sluice::agent
