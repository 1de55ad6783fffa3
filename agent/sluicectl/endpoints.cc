// sluicectl endpoints: the local endpoints the datapath delivers to, named by pod.
#include <arpa/inet.h>

#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {

int Endpoints() {
  const bool json = JsonOutput();
  if (!PodFlagNamesALocalPod()) return 1;
  auto eps = OpenOrDie<maps::EndpointMap>(maps::name::sluice_ep4);
  auto pods = PodNamesByAddress();
  auto pod_of = [&](const std::string& ip) {
    auto it = pods.find(ip);
    return it == pods.end() ? std::string("(no endpoint record)") : it->second;
  };
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::printf("%-16s %-6s %-8s %-18s %-18s %s\n", "ADDRESS", "ID", "IFINDEX", "POD MAC",
                "HOST MAC", "POD");
  }
  auto st = eps.ForEach([&](const sluice_ep4_key& k, const sluice_endpoint& v) {
    const std::string ip = Ip(k.addr);
    if (!PodSelected(pod_of(ip))) return;
    if (json) {
      out.push_back({{"address", ip},
                     {"endpointID", v.endpoint_id},
                     {"ifindex", v.ifindex},
                     {"mac", Mac(v.mac)},
                     {"hostMAC", Mac(v.host_mac)},
                     {"pod", pod_of(ip)}});
      return;
    }
    std::printf("%-16s %-6u %-8u %-18s %-18s %s\n", ip.c_str(), v.endpoint_id, v.ifindex,
                Mac(v.mac).c_str(), Mac(v.host_mac).c_str(), pod_of(ip).c_str());
  });
  if (json) PrintJson(out);
  return st.ok() ? 0 : 1;
}

}  // namespace sluice::ctl
