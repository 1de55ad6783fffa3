// sluicectl identities / sluicectl policy get NAMESPACE/POD: NetworkPolicy as the datapath holds
// it, with identities resolved to their label sets (the agent's <state_dir>/identities.json).
#include <arpa/inet.h>

#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/policy/identity.h"
#include "agent/policy/reconciler.h"
#include "agent/policy/sync.h"
#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {

using agent::IdentityRecord;

std::map<uint32_t, std::string> IdentityNames() {
  std::map<uint32_t, std::string> out;
  for (uint32_t id = SLUICE_IDENTITY_HOST; id <= SLUICE_IDENTITY_REMOTE_NODE; ++id) {
    out[id] = absl::StrJoin(agent::ReservedLabels(id), ",");
  }
  out[SLUICE_IDENTITY_ANY] = "(any peer)";
  auto records = agent::LoadIdentities(absl::GetFlag(FLAGS_state_dir));
  if (!records.ok()) {
    std::fprintf(stderr, "sluicectl: identities: %s\n",
                 std::string(records.status().message()).c_str());
    return out;
  }
  for (const IdentityRecord& r : *records) out[r.id] = absl::StrJoin(r.labels, ",");
  return out;
}

nlohmann::json LoadPolicyStatus() {
  std::ifstream in(absl::GetFlag(FLAGS_state_dir) + "/" + agent::kPolicyStatusFile);
  if (!in) return nullptr;
  std::stringstream buf;
  buf << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json(nullptr);
}

namespace {

std::string Named(const std::map<uint32_t, std::string>& names, uint32_t id) {
  auto it = names.find(id);
  return it == names.end() ? "(unknown)" : it->second;
}

std::string Ports(const agent::PolicyAllow& a) {
  if (a.proto_port_bits == 0) return "any";
  std::string proto = Proto(a.proto);
  if (a.proto == IPPROTO_SCTP) proto = "sctp";
  if (a.proto_port_bits == 8) return proto + "/*";
  int n = a.proto_port_bits - 8;
  uint32_t last = a.port + (1u << (16 - n)) - 1;
  if (last == a.port) return proto + "/" + std::to_string(a.port);
  return proto + "/" + std::to_string(a.port) + "-" + std::to_string(last);
}

}  // namespace

int Identities() {
  auto names = IdentityNames();
  auto ipcache = OpenOrDie<maps::Ipcache4Map>(maps::name::sluice_ipcache4);
  std::map<uint32_t, std::vector<std::string>> prefixes;
  auto st = ipcache.ForEach([&](const sluice_lpm4_key& k, const sluice_ipcache4_entry& v) {
    prefixes[v.identity].push_back(Ip(k.addr) + "/" + std::to_string(k.prefixlen));
  });
  if (!st.ok()) {
    std::fprintf(stderr, "sluicectl: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  for (const auto& [id, p] : prefixes) names.try_emplace(id, "(unknown)");
  if (JsonOutput()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [id, labels] : names) {
      if (id == SLUICE_IDENTITY_ANY) continue;
      out.push_back({{"identity", id}, {"labels", labels}, {"prefixes", prefixes[id]}});
    }
    PrintJson(out);
    return 0;
  }
  std::printf("%-9s %-8s %s\n", "IDENTITY", "PREFIXES", "LABELS");
  for (const auto& [id, labels] : names) {
    if (id == SLUICE_IDENTITY_ANY) continue;
    std::printf("%-9u %-8zu %s\n", id, prefixes[id].size(), labels.c_str());
  }
  return 0;
}

int Policy(const std::vector<std::string>& args) {
  if (args.size() != 2 || args[0] != "get" || args[1].empty() || args[1].front() == '/' ||
      args[1].back() == '/') {
    std::fprintf(stderr, "usage: sluicectl policy get [NAMESPACE/]POD\n");
    return 2;
  }
  const bool json = JsonOutput();
  // POD alone means namespace default, as observe's --pod and sluice-lab's FROM read it.
  const std::string want = args[1].find('/') == std::string::npos ? "default/" + args[1] : args[1];
  std::optional<agent::Endpoint> ep;
  std::error_code ec;
  for (agent::Endpoint& e : EndpointRecords(&ec)) {
    if (e.pod_namespace + "/" + e.pod_name == want) ep = std::move(e);
  }
  if (ec) {
    std::fprintf(stderr, "sluicectl: endpoint records under %s: %s\n",
                 absl::GetFlag(FLAGS_state_dir).c_str(), ec.message().c_str());
    return 1;
  }
  if (!ep) {
    std::fprintf(stderr, "sluicectl: no endpoint of pod %s on this node (records under %s)\n",
                 want.c_str(), absl::GetFlag(FLAGS_state_dir).c_str());
    return 1;
  }
  auto names = IdentityNames();
  auto eps = OpenOrDie<maps::PolicyEndpointMap>(maps::name::sluice_policy_ep);
  auto rules = OpenOrDie<maps::Policy4Map>(maps::name::sluice_policy4);
  auto drops = OpenOrDie<maps::PolicyDropMap>(maps::name::sluice_pol_drops);
  nlohmann::json out = {{"pod", want}, {"endpoint", ep->endpoint_id}, {"address", ep->ipv4}};
  auto entry = eps.Lookup(ep->endpoint_id);
  if (!entry.ok()) {
    out["policy"] = false;
    if (json) {
      PrintJson(out);
    } else {
      std::printf("pod %s  endpoint %u  address %s\n", want.c_str(), ep->endpoint_id,
                  ep->ipv4.c_str());
      std::printf("no policy entry: outside policy (every direction open, flows not tracked)\n");
    }
    return 0;
  }
  out["policy"] = true;
  // Whether the maps hold its policy whole (the agent's word, as of its last batch).
  nlohmann::json degraded;
  if (nlohmann::json st = LoadPolicyStatus(); st.is_object()) {
    for (const auto& d : st.value("degraded", nlohmann::json::array())) {
      if (d.value("endpoint", 0u) == ep->endpoint_id && d.value("pod", "") == want) degraded = d;
    }
    out["state"] = degraded.is_null() ? "healthy" : "degraded";
    if (!degraded.is_null()) out["degraded"] = degraded;
  } else {
    out["state"] = "unknown";
  }
  out["identity"] = entry->identity;
  out["labels"] = Named(names, entry->identity);
  for (uint8_t dir : {SLUICE_POLICY_INGRESS, SLUICE_POLICY_EGRESS}) {
    bool enforced = entry->flags & (dir == SLUICE_POLICY_INGRESS ? SLUICE_POLICY_EP_F_INGRESS
                                                                 : SLUICE_POLICY_EP_F_EGRESS);
    sluice_policy_drop_key dk{};
    dk.endpoint_id = ep->endpoint_id;
    dk.direction = dir;
    uint64_t denied = 0;
    if (auto per_cpu = drops.Lookup(dk); per_cpu.ok()) {
      for (const auto& c : *per_cpu) denied += c.packets;
    }
    nlohmann::json allows = nlohmann::json::array();
    if (enforced) {
      auto st = rules.ForEach([&](const sluice_policy4_key& k, const sluice_policy4_entry&) {
        uint32_t id = 0;
        agent::PolicyAllow a = agent::AllowOfKey(k, &id);
        if (id != ep->endpoint_id || a.direction != dir) return;
        allows.push_back(
            {{"ports", Ports(a)}, {"peer", a.identity}, {"peerLabels", Named(names, a.identity)}});
      });
      if (!st.ok()) {
        std::fprintf(stderr, "sluicectl: %s\n", std::string(st.message()).c_str());
        return 1;
      }
    }
    out[dir == SLUICE_POLICY_INGRESS ? "ingress" : "egress"] = {
        {"enforced", enforced}, {"deniedPackets", denied}, {"allows", allows}};
  }
  if (json) {
    PrintJson(out);
    return 0;
  }
  std::printf("pod %s  endpoint %u  address %s\n", want.c_str(), ep->endpoint_id, ep->ipv4.c_str());
  std::printf("identity %u  %s\n", entry->identity, Named(names, entry->identity).c_str());
  if (!degraded.is_null()) {
    std::printf("state degraded (%s): %s\n", degraded.value("reason", "").c_str(),
                degraded.value("message", "").c_str());
    std::printf("(the allows below are its last complete policy)\n");
  } else {
    std::printf("state %s\n", out["state"].get<std::string>().c_str());
  }
  for (const char* dir : {"ingress", "egress"}) {
    const nlohmann::json& d = out[dir];
    const bool enforced = d["enforced"].get<bool>();
    std::printf("\n%s: %s, %llu packets denied\n", dir,
                enforced ? "enforced" : "open (no policy selects it)",
                static_cast<unsigned long long>(d["deniedPackets"].get<uint64_t>()));
    if (!enforced) continue;
    std::printf("  %-14s %-9s %s\n", "PORTS", "PEER", "PEER LABELS");
    for (const auto& a : d["allows"]) {
      std::printf("  %-14s %-9u %s\n", a["ports"].get<std::string>().c_str(),
                  a["peer"].get<uint32_t>(), a["peerLabels"].get<std::string>().c_str());
    }
  }
  return 0;
}

}  // namespace sluice::ctl
