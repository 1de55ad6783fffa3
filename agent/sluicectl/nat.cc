// sluicectl nat: masqueraded flows (pod tuple -> node address:port).
#include <arpa/inet.h>

#include <string>

#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {

int Nat() {
  const bool json = JsonOutput();
  auto snat = OpenOrDie<maps::NatMap>(maps::name::sluice_snat4);
  auto pods = PodNamesByAddress();
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::printf("%-5s %-22s %-22s %-22s %s\n", "PROTO", "POD", "REMOTE", "MASQUERADED AS",
                "POD NAME");
  }
  auto st = snat.ForEach([&](const sluice_nat4_key& k, const sluice_nat4_entry& v) {
    std::string pod = Ip(k.saddr) + ":" + std::to_string(ntohs(k.sport));
    std::string remote = Ip(k.daddr) + ":" + std::to_string(ntohs(k.dport));
    std::string as = Ip(v.addr) + ":" + std::to_string(ntohs(v.port));
    auto it = pods.find(Ip(k.saddr));
    std::string name = it == pods.end() ? "-" : it->second;
    if (!PodSelected(name)) return;
    if (json) {
      out.push_back({{"proto", Proto(k.proto)},
                     {"pod", pod},
                     {"remote", remote},
                     {"masqueradedAs", as},
                     {"podName", name}});
      return;
    }
    std::printf("%-5s %-22s %-22s %-22s %s\n", Proto(k.proto), pod.c_str(), remote.c_str(),
                as.c_str(), name.c_str());
  });
  if (json) PrintJson(out);
  return st.ok() ? 0 : 1;
}

}  // namespace sluice::ctl
