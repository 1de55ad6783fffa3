// sluicectl nat: masqueraded flows (pod tuple -> node address:port), with their state and idle
// time, both directions taken together as the GC takes them (agent/conntrack/gc).
#include <arpa/inet.h>

#include <algorithm>
#include <string>

#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {

int Nat() {
  const bool json = JsonOutput();
  if (!PodFlagNamesALocalPod()) return 1;
  auto snat = OpenOrDie<maps::NatMap>(maps::name::sluice_snat4);
  auto rnat = OpenOrDie<maps::NatMap>(maps::name::sluice_rnat4);
  const uint64_t now = NowNs();
  auto pods = PodNamesByAddress();
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::printf("%-5s %-22s %-22s %-22s %-20s %8s %s\n", "PROTO", "POD", "REMOTE",
                "MASQUERADED AS", "POD NAME", "IDLE(s)", "FLAGS");
  }
  auto st = snat.ForEach([&](const sluice_nat4_key& k, const sluice_nat4_entry& v) {
    std::string pod = Ip(k.saddr) + ":" + std::to_string(ntohs(k.sport));
    std::string remote = Ip(k.daddr) + ":" + std::to_string(ntohs(k.dport));
    std::string as = Ip(v.addr) + ":" + std::to_string(ntohs(v.port));
    auto it = pods.find(Ip(k.saddr));
    std::string name = it == pods.end() ? "-" : it->second;
    if (!PodSelected(name)) return;
    // The reply's entry: the remote answering the node address and port.
    sluice_nat4_key rkey;
    sluice_nat4_reply_key(&rkey, &k, v.addr, v.port);
    uint8_t state = v.flags;
    uint64_t last_seen = v.last_seen_ns;
    auto reply = rnat.Lookup(rkey);
    if (reply.ok()) {
      state |= reply->flags;
      last_seen = std::max<uint64_t>(last_seen, reply->last_seen_ns);
    }
    const double idle = now > last_seen ? (now - last_seen) / 1e9 : 0;
    std::string flags;
    if (state & SLUICE_CT_F_ESTABLISHED) flags += "established ";
    if (state & SLUICE_CT_F_CLOSING) flags += "closing ";
    if (!(state & SLUICE_NAT_F_STATEFUL)) flags += "stateless ";  // older programs' mapping
    if (!reply.ok()) flags += "no-reply-entry ";
    if (!flags.empty()) flags.pop_back();
    if (json) {
      out.push_back({{"proto", Proto(k.proto)},
                     {"pod", pod},
                     {"remote", remote},
                     {"masqueradedAs", as},
                     {"podName", name},
                     {"idleSeconds", idle},
                     {"flags", flags}});
      return;
    }
    std::printf("%-5s %-22s %-22s %-22s %-20s %8.1f %s\n", Proto(k.proto), pod.c_str(),
                remote.c_str(), as.c_str(), name.c_str(), idle,
                flags.empty() ? "-" : flags.c_str());
  });
  if (json) PrintJson(out);
  return st.ok() ? 0 : 1;
}

}  // namespace sluice::ctl
