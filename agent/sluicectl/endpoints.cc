// sluicectl endpoints: the local endpoints the datapath delivers to, named by pod, with their
// bandwidth limits (from the endpoint records; "shaped" when the map entry sends through the
// host veth's qdisc).
#include <arpa/inet.h>

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {
namespace {

// "8Mbit/s" for 8000000: the largest decimal unit that divides the rate.
std::string RateText(uint64_t bits) {
  for (auto [unit, name] : {std::pair{uint64_t{1000000000}, "G"}, std::pair{uint64_t{1000000}, "M"},
                            std::pair{uint64_t{1000}, "k"}}) {
    if (bits % unit == 0) return absl::StrCat(bits / unit, name, "bit/s");
  }
  return absl::StrCat(bits, "bit/s");
}

std::string LimitsText(const agent::Endpoint* ep) {
  if (ep == nullptr || (!ep->ingress.limited() && !ep->egress.limited())) return "-";
  std::string out;
  if (ep->ingress.limited()) absl::StrAppend(&out, "in ", RateText(ep->ingress.rate));
  if (ep->egress.limited()) {
    absl::StrAppend(&out, out.empty() ? "" : ",", "out ", RateText(ep->egress.rate));
  }
  return out;
}

}  // namespace

int Endpoints() {
  const bool json = JsonOutput();
  if (!PodFlagNamesALocalPod()) return 1;
  auto eps = OpenOrDie<maps::EndpointMap>(maps::name::sluice_ep4);
  auto pods = PodNamesByAddress();
  std::map<std::string, agent::Endpoint> records;
  for (agent::Endpoint& e : EndpointRecords()) {
    if (!e.ipv4.empty()) records[e.ipv4] = std::move(e);
  }
  auto pod_of = [&](const std::string& ip) {
    auto it = pods.find(ip);
    return it == pods.end() ? std::string("(no endpoint record)") : it->second;
  };
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::printf("%-16s %-6s %-8s %-18s %-18s %-30s %s\n", "ADDRESS", "ID", "IFINDEX", "POD MAC",
                "HOST MAC", "BANDWIDTH", "POD");
  }
  auto st = eps.ForEach([&](const sluice_ep4_key& k, const sluice_endpoint& v) {
    const std::string ip = Ip(k.addr);
    if (!PodSelected(pod_of(ip))) return;
    auto rec = records.find(ip);
    const agent::Endpoint* ep = rec == records.end() ? nullptr : &rec->second;
    const bool shaped = (v.flags & SLUICE_EP_F_INGRESS_SHAPED) != 0;
    if (json) {
      nlohmann::json row = {
          {"address", ip},          {"endpointID", v.endpoint_id}, {"ifindex", v.ifindex},
          {"mac", Mac(v.mac)},      {"hostMAC", Mac(v.host_mac)},  {"pod", pod_of(ip)},
          {"ingressShaped", shaped}};
      if (ep != nullptr && ep->ingress.limited()) {
        row["ingressRate"] = ep->ingress.rate;
        row["ingressBurstBytes"] = ep->ingress.burst_bytes;
      }
      if (ep != nullptr && ep->egress.limited()) {
        row["egressRate"] = ep->egress.rate;
        row["egressBurstBytes"] = ep->egress.burst_bytes;
      }
      out.push_back(std::move(row));
      return;
    }
    std::string limits = LimitsText(ep);
    // An ingress limit the map entry does not send through (an agent not yet restored).
    if (ep != nullptr && ep->ingress.limited() != shaped) limits += " (map entry not shaped)";
    std::printf("%-16s %-6u %-8u %-18s %-18s %-30s %s\n", ip.c_str(), v.endpoint_id, v.ifindex,
                Mac(v.mac).c_str(), Mac(v.host_mac).c_str(), limits.c_str(), pod_of(ip).c_str());
  });
  if (json) PrintJson(out);
  return st.ok() ? 0 : 1;
}

}  // namespace sluice::ctl
