#include "agent/monitor/flow.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "maps/drop.h"
#include "maps/policy.h"
#include "nlohmann/json.hpp"

namespace sluice::monitor {
namespace {

std::string Ip4Text(uint32_t be) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &be, buf, sizeof(buf));
  return buf;
}

std::string AddrText(uint8_t family, const __be32* addr) {
  if (family == 4) return Ip4Text(addr[0]);
  if (family == 6) {
    char buf[INET6_ADDRSTRLEN] = {};
    inet_ntop(AF_INET6, addr, buf, sizeof(buf));
    return buf;
  }
  return "";
}

const char* TypeText(uint8_t type) {
  switch (type) {
    case SLUICE_EVENT_DROP:
      return "drop";
    case SLUICE_EVENT_POLICY:
      return "policy";
    case SLUICE_EVENT_TRANSLATE:
      return "translate";
    case SLUICE_EVENT_CT_CLOSE:
      return "close";
    default:
      return "unknown";
  }
}

nlohmann::json PeerToJson(const FlowPeer& p) {
  nlohmann::json j = {{"ip", p.ip}, {"port", p.port}};
  if (!p.pod.empty()) {
    j["namespace"] = p.namespace_;
    j["pod"] = p.pod;
  }
  return j;
}

FlowPeer PeerFromJson(const nlohmann::json& j) {
  FlowPeer p;
  if (!j.is_object()) return p;
  p.ip = j.value("ip", "");
  p.port = j.value("port", 0);
  p.namespace_ = j.value("namespace", "");
  p.pod = j.value("pod", "");
  return p;
}

}  // namespace

const char* ProtocolText(uint8_t proto, char (&buf)[8]) {
  switch (proto) {
    case IPPROTO_TCP:
      return "tcp";
    case IPPROTO_UDP:
      return "udp";
    case IPPROTO_ICMP:
      return "icmp";
    case IPPROTO_SCTP:
      return "sctp";
    default:
      std::snprintf(buf, sizeof(buf), "%u", proto);
      return buf;
  }
}

std::string TcpFlagsText(uint8_t flags) {
  static constexpr std::pair<uint8_t, const char*> kNames[] = {
      {0x02, "SYN"}, {0x10, "ACK"}, {0x01, "FIN"}, {0x04, "RST"}, {0x08, "PSH"}, {0x20, "URG"}};
  std::vector<const char*> on;
  for (const auto& [bit, name] : kNames) {
    if (flags & bit) on.push_back(name);
  }
  return absl::StrJoin(on, "|");
}

absl::Duration MonotonicToWallOffset() {
  struct timespec mono, wall;
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_REALTIME, &wall);
  return absl::DurationFromTimespec(wall) - absl::DurationFromTimespec(mono);
}

Flow DecodeEvent(const sluice_event& e, absl::Duration mono_to_wall, const std::string& node) {
  Flow f;
  f.time = absl::UnixEpoch() + absl::Nanoseconds(e.ts_ns) + mono_to_wall;
  f.node = node;
  f.type = TypeText(e.type);
  f.verdict = e.verdict == SLUICE_VERDICT_DROPPED ? "dropped" : "forwarded";
  if (e.verdict == SLUICE_VERDICT_DROPPED) {
    const char* name = sluice_drop_reason_name(e.reason);
    f.drop_reason = name ? name : absl::StrCat("reason_", e.reason);
  }
  if (e.point == SLUICE_POINT_INGRESS) f.point = "ingress";
  if (e.point == SLUICE_POINT_EGRESS) f.point = "egress";
  if (e.type == SLUICE_EVENT_POLICY) {
    f.policy_direction = e.policy_dir == SLUICE_POLICY_INGRESS ? "ingress" : "egress";
    f.policy_enforced = (e.flags & SLUICE_EVENT_F_ENFORCED) != 0;
    f.endpoint_id = e.id;
  }
  f.ifindex = e.ifindex;
  char buf[8];
  if (e.family != 0) f.protocol = ProtocolText(e.proto, buf);
  if (e.proto == IPPROTO_TCP) f.tcp_flags = TcpFlagsText(e.tcp_flags);
  f.source.ip = AddrText(e.family, e.saddr);
  f.destination.ip = AddrText(e.family, e.daddr);
  f.source.port = ntohs(e.sport);
  f.destination.port = ntohs(e.dport);
  if (e.type == SLUICE_EVENT_TRANSLATE || e.type == SLUICE_EVENT_CT_CLOSE) {
    f.rev_nat_id = e.id;
    f.backend.ip = AddrText(e.family, e.nat_addr);
    f.backend.port = ntohs(e.nat_port);
  }
  f.bytes = e.len;
  f.cpu = e.cpu;
  return f;
}

nlohmann::json FlowToJson(const Flow& f) {
  nlohmann::json j = {
      {"time", absl::FormatTime(absl::RFC3339_full, f.time, absl::UTCTimeZone())},
      {"node", f.node},
      {"type", f.type},
      {"verdict", f.verdict},
      {"source", PeerToJson(f.source)},
      {"destination", PeerToJson(f.destination)},
      {"protocol", f.protocol},
      {"bytes", f.bytes},
      {"cpu", f.cpu},
  };
  if (!f.drop_reason.empty()) j["drop_reason"] = f.drop_reason;
  if (!f.point.empty()) j["point"] = f.point;
  if (f.ifindex != 0) {
    j["ifindex"] = f.ifindex;
    if (!f.interface.empty()) j["interface"] = f.interface;
  }
  if (!f.tcp_flags.empty()) j["tcp_flags"] = f.tcp_flags;
  if (!f.policy_direction.empty()) {
    j["policy"] = {{"direction", f.policy_direction},
                   {"enforced", f.policy_enforced},
                   {"endpoint_id", f.endpoint_id}};
  }
  if (f.rev_nat_id != 0) {
    nlohmann::json svc = {{"rev_nat_id", f.rev_nat_id}};
    if (!f.service.empty()) {
      svc["namespace"] = f.service_namespace;
      svc["name"] = f.service;
    }
    j["service"] = svc;
    j["backend"] = PeerToJson(f.backend);
  }
  return j;
}

absl::StatusOr<Flow> FlowFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("a flow is a JSON object");
  Flow f;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, j.value("time", ""), &f.time, &err)) {
    return absl::InvalidArgumentError(absl::StrCat("flow time: ", err));
  }
  f.node = j.value("node", "");
  f.type = j.value("type", "");
  f.verdict = j.value("verdict", "");
  f.drop_reason = j.value("drop_reason", "");
  f.point = j.value("point", "");
  f.ifindex = j.value("ifindex", 0u);
  f.interface = j.value("interface", "");
  f.protocol = j.value("protocol", "");
  f.tcp_flags = j.value("tcp_flags", "");
  f.bytes = j.value("bytes", 0u);
  f.cpu = j.value("cpu", 0u);
  if (j.contains("source")) f.source = PeerFromJson(j["source"]);
  if (j.contains("destination")) f.destination = PeerFromJson(j["destination"]);
  if (j.contains("policy") && j["policy"].is_object()) {
    const auto& p = j["policy"];
    f.policy_direction = p.value("direction", "");
    f.policy_enforced = p.value("enforced", false);
    f.endpoint_id = p.value("endpoint_id", 0u);
  }
  if (j.contains("service") && j["service"].is_object()) {
    const auto& s = j["service"];
    f.rev_nat_id = s.value("rev_nat_id", 0u);
    f.service_namespace = s.value("namespace", "");
    f.service = s.value("name", "");
  }
  if (j.contains("backend")) f.backend = PeerFromJson(j["backend"]);
  return f;
}

std::string PeerText(const FlowPeer& p) {
  std::string who = p.pod.empty() ? p.ip : absl::StrCat(p.namespace_, "/", p.pod);
  if (p.port != 0) absl::StrAppend(&who, ":", p.port);
  return who;
}

}  // namespace sluice::monitor
