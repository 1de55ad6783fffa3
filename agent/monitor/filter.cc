#include "agent/monitor/filter.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/base/net.h"
#include "maps/drop.h"
#include "nlohmann/json.hpp"

namespace sluice::monitor {
namespace {

template <typename T, typename F>
bool AnyOf(const std::vector<T>& values, F&& f) {
  return values.empty() || std::any_of(values.begin(), values.end(), f);
}

// "ns/name" -> {ns, name}; "name" -> {"default", name}.
std::pair<std::string, std::string> SplitName(const std::string& s) {
  auto slash = s.find('/');
  if (slash == std::string::npos) return {"default", s};
  return {s.substr(0, slash), s.substr(slash + 1)};
}

bool IpMatches(const std::string& want, const std::string& ip) {
  if (ip.empty()) return false;
  if (want.find('/') == std::string::npos) return want == ip;
  auto prefix = agent::IpPrefix::Parse(want);
  auto addr = agent::IpAddress::Parse(ip);
  return prefix.ok() && addr.ok() && prefix->Contains(*addr);
}

std::vector<const FlowPeer*> Peers(const Flow& f) {
  std::vector<const FlowPeer*> peers = {&f.source, &f.destination};
  if (!f.backend.ip.empty()) peers.push_back(&f.backend);
  return peers;
}

absl::StatusOr<std::vector<std::string>> Strings(const nlohmann::json& j, const char* key) {
  std::vector<std::string> out;
  if (!j.contains(key)) return out;
  const auto& v = j[key];
  if (!v.is_array()) return absl::InvalidArgumentError(absl::StrCat(key, " must be a list"));
  for (const auto& s : v) {
    if (!s.is_string() || s.get<std::string>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(key, " must hold non-empty strings"));
    }
    out.push_back(s.get<std::string>());
  }
  return out;
}

bool KnownDropReason(const std::string& name) {
  for (unsigned r = 0; r < SLUICE_DROP_MAX; ++r) {
    const char* n = sluice_drop_reason_name(r);
    if (n && name == n) return true;
  }
  return false;
}

}  // namespace

bool FlowFilter::empty() const {
  return pods.empty() && namespaces.empty() && ips.empty() && ports.empty() && protocols.empty() &&
         verdict.empty() && drop_reasons.empty() && services.empty() && types.empty();
}

bool Matches(const FlowFilter& filter, const Flow& flow) {
  const auto peers = Peers(flow);
  auto any_peer = [&](auto&& pred) {
    return std::any_of(peers.begin(), peers.end(), [&](const FlowPeer* p) { return pred(*p); });
  };
  if (!filter.verdict.empty() && filter.verdict != flow.verdict) return false;
  if (!AnyOf(filter.types, [&](const std::string& t) { return t == flow.type; })) return false;
  if (!AnyOf(filter.protocols, [&](const std::string& p) { return p == flow.protocol; }))
    return false;
  if (!AnyOf(filter.drop_reasons, [&](const std::string& r) { return r == flow.drop_reason; }))
    return false;
  if (!AnyOf(filter.pods, [&](const std::string& want) {
        const auto split = SplitName(want);
        return any_peer([&](const FlowPeer& p) {
          return p.namespace_ == split.first && p.pod == split.second;
        });
      }))
    return false;
  if (!AnyOf(filter.namespaces, [&](const std::string& ns) {
        return any_peer([&](const FlowPeer& p) { return !p.pod.empty() && p.namespace_ == ns; }) ||
               (!flow.service.empty() && flow.service_namespace == ns);
      }))
    return false;
  if (!AnyOf(filter.ips, [&](const std::string& want) {
        return any_peer([&](const FlowPeer& p) { return IpMatches(want, p.ip); });
      }))
    return false;
  if (!AnyOf(filter.ports, [&](uint16_t port) {
        return any_peer([&](const FlowPeer& p) { return p.port == port; });
      }))
    return false;
  if (!AnyOf(filter.services, [&](const std::string& want) {
        auto [ns, name] = SplitName(want);
        return flow.service_namespace == ns && flow.service == name;
      }))
    return false;
  return true;
}

nlohmann::json FilterToJson(const FlowFilter& f) {
  nlohmann::json j = nlohmann::json::object();
  auto put = [&](const char* key, const auto& v) {
    if (!v.empty()) j[key] = v;
  };
  put("pods", f.pods);
  put("namespaces", f.namespaces);
  put("ips", f.ips);
  put("ports", f.ports);
  put("protocols", f.protocols);
  put("verdict", f.verdict);
  put("drop_reasons", f.drop_reasons);
  put("services", f.services);
  put("types", f.types);
  return j;
}

absl::StatusOr<FlowFilter> FilterFromJson(const nlohmann::json& j) {
  FlowFilter f;
  if (j.is_null()) return f;
  if (!j.is_object()) return absl::InvalidArgumentError("filter must be an object");
  for (const auto& [key, value] : j.items()) {
    static constexpr const char* kKeys[] = {"pods",         "namespaces", "ips",
                                            "ports",        "protocols",  "verdict",
                                            "drop_reasons", "services",   "types"};
    const std::string& name = key;  // a structured binding: clang 14 cannot capture one
    if (std::none_of(std::begin(kKeys), std::end(kKeys),
                     [&](const char* k) { return name == k; })) {
      return absl::InvalidArgumentError(absl::StrCat("unknown filter ", key));
    }
  }
  struct {
    const char* key;
    std::vector<std::string>* out;
  } lists[] = {
      {"pods", &f.pods},           {"namespaces", &f.namespaces},     {"ips", &f.ips},
      {"protocols", &f.protocols}, {"drop_reasons", &f.drop_reasons}, {"services", &f.services},
      {"types", &f.types}};
  for (auto& l : lists) {
    auto v = Strings(j, l.key);
    if (!v.ok()) return v.status();
    *l.out = std::move(*v);
  }
  if (j.contains("ports")) {
    if (!j["ports"].is_array()) return absl::InvalidArgumentError("ports must be a list");
    for (const auto& p : j["ports"]) {
      if (!p.is_number_integer() || p.get<int64_t>() < 1 || p.get<int64_t>() > 65535) {
        return absl::InvalidArgumentError("ports must be numbers 1-65535");
      }
      f.ports.push_back(static_cast<uint16_t>(p.get<int64_t>()));
    }
  }
  if (j.contains("verdict")) {
    if (!j["verdict"].is_string()) return absl::InvalidArgumentError("verdict must be a string");
    f.verdict = absl::AsciiStrToLower(j["verdict"].get<std::string>());
    if (f.verdict != "forwarded" && f.verdict != "dropped") {
      return absl::InvalidArgumentError(
          absl::StrCat("verdict ", f.verdict, ": want forwarded or dropped"));
    }
  }
  for (auto& p : f.protocols) {
    p = absl::AsciiStrToLower(p);
    if (p != "tcp" && p != "udp" && p != "icmp" && p != "sctp") {
      return absl::InvalidArgumentError(
          absl::StrCat("protocol ", p, ": want tcp, udp, icmp or sctp"));
    }
  }
  for (const auto& r : f.drop_reasons) {
    if (!KnownDropReason(r)) {
      return absl::InvalidArgumentError(
          absl::StrCat("drop reason ", r, " is none of `sluicectl drops`' names"));
    }
  }
  for (const auto& t : f.types) {
    if (t != "drop" && t != "policy" && t != "translate" && t != "close") {
      return absl::InvalidArgumentError(
          absl::StrCat("type ", t, ": want drop, policy, translate or close"));
    }
  }
  for (const auto& ip : f.ips) {
    bool ok = ip.find('/') == std::string::npos ? agent::IpAddress::Parse(ip).ok()
                                                : agent::IpPrefix::Parse(ip).ok();
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("ip ", ip, " is no address or CIDR"));
  }
  return f;
}

}  // namespace sluice::monitor
