// sluicectl endpoints: the local endpoints the datapath delivers to.
#include <arpa/inet.h>

#include "agent/sluicectl/common.h"

namespace sluice::ctl {

int Endpoints() {
  auto eps = OpenOrDie<maps::EndpointMap>(maps::name::sluice_ep4);
  std::printf("%-16s %-6s %-8s %-18s %-18s\n", "ADDRESS", "ID", "IFINDEX", "POD MAC", "HOST MAC");
  auto st = eps.ForEach([](const sluice_ep4_key& k, const sluice_endpoint& v) {
    std::printf("%-16s %-6u %-8u %-18s %-18s\n", Ip(k.addr).c_str(), v.endpoint_id, v.ifindex,
                Mac(v.mac).c_str(), Mac(v.host_mac).c_str());
  });
  return st.ok() ? 0 : 1;
}

}  // namespace sluice::ctl
