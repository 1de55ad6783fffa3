// sluicectl nat: masqueraded flows (pod tuple -> node address:port).
#include <arpa/inet.h>

#include <string>

#include "agent/sluicectl/common.h"

namespace sluice::ctl {

int Nat() {
  auto snat = OpenOrDie<maps::NatMap>(maps::name::sluice_snat4);
  std::printf("%-5s %-22s %-22s %-22s\n", "PROTO", "POD", "REMOTE", "MASQUERADED AS");
  auto st = snat.ForEach([](const sluice_nat4_key& k, const sluice_nat4_entry& v) {
    std::printf("%-5s %-22s %-22s %-22s\n", Proto(k.proto),
                (Ip(k.saddr) + ":" + std::to_string(ntohs(k.sport))).c_str(),
                (Ip(k.daddr) + ":" + std::to_string(ntohs(k.dport))).c_str(),
                (Ip(v.addr) + ":" + std::to_string(ntohs(v.port))).c_str());
  });
  return st.ok() ? 0 : 1;
}

}  // namespace sluice::ctl
