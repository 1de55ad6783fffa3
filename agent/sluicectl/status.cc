// sluicectl status: the node on one screen, as `cilium status` gives it. The agent's part
// (up, version, readiness, watches, configuration) comes from its health server; everything
// else is read straight from the pinned maps, the state directory and the kernel, so the
// screen still says what the datapath does while the agent is down.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/metrics/datapath_metrics.h"
#include "agent/monitor/monitor.h"
#include "agent/sluicectl/common.h"
#include "agent/sluicectl/service_names.h"
#include "loader/datapath.h"
#include "loader/tc.h"
#include "loader/xdp.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {

std::string ProgName(uint32_t id) {
  int fd = bpf_prog_get_fd_by_id(id);
  if (fd < 0) return absl::StrCat("prog ", id);
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  std::string name = bpf_obj_get_info_by_fd(fd, &info, &len) == 0 ? info.name : "?";
  ::close(fd);
  return name;
}

namespace {

// Interfaces of this network namespace with a Sluice TC or XDP program, and which.
std::vector<std::pair<std::string, std::string>> AttachedPrograms() {
  std::vector<std::pair<std::string, std::string>> out;
  // An interface without clsact is simply not ours: keep libbpf from printing about it.
  libbpf_print_fn_t old = libbpf_set_print(nullptr);
  struct if_nameindex* all = if_nameindex();
  if (all == nullptr) return out;
  for (struct if_nameindex* i = all; i->if_index != 0; ++i) {
    std::string progs;
    // NodePort acceleration (--lb_acceleration=native): Sluice's XDP program and its mode.
    if (auto id = loader::AttachedXdpProgram(static_cast<int>(i->if_index)); id.ok() && *id != 0) {
      std::string name = ProgName(*id);
      auto mode = loader::AttachedXdpMode(static_cast<int>(i->if_index));
      if (absl::StartsWith(name, "sluice_") && mode.ok()) {
        absl::StrAppend(&progs, "xdp (", loader::XdpModeName(*mode), ") ", name);
      }
    }
    for (auto dir : {loader::TcDirection::kIngress, loader::TcDirection::kEgress}) {
      auto id = loader::AttachedTcProgram(static_cast<int>(i->if_index), dir);
      if (!id.ok() || *id == 0) continue;
      absl::StrAppend(&progs, progs.empty() ? "" : ", ",
                      dir == loader::TcDirection::kIngress ? "ingress " : "egress ", ProgName(*id));
    }
    if (!progs.empty()) out.emplace_back(i->if_name, progs);
  }
  if_freenameindex(all);
  libbpf_set_print(old);
  return out;
}

struct Ipam {
  std::string cidr;
  uint64_t used = 0, total = 0;
};

Ipam ReadIpam() {
  Ipam ipam;
  auto node = maps::NodeConfigMap::Open(
      maps::PinPath(absl::GetFlag(FLAGS_bpffs_root), maps::name::sluice_node));
  if (!node.ok()) return ipam;
  auto cfg = node->Lookup(0);
  if (!cfg.ok() || cfg->pod_cidr4_len == 0) return ipam;
  ipam.cidr = absl::StrCat(Ip(cfg->pod_cidr4), "/", cfg->pod_cidr4_len);
  // The CIDR minus network, broadcast and gateway, as the agent's IPAM counts it.
  const uint64_t size = 1ull << (32 - cfg->pod_cidr4_len);
  ipam.total = size > 3 ? size - 3 : 0;
  std::string dir = absl::StrCat(absl::GetFlag(FLAGS_state_dir), "/ipam/", Ip(cfg->pod_cidr4), "_",
                                 cfg->pod_cidr4_len);
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = f.path().filename();
    if (f.is_regular_file() && n.find('.') != std::string::npos && n != "last_reserved") {
      ++ipam.used;  // one file per address, named by it
    }
  }
  return ipam;
}

}  // namespace

int Status() {
  const bool json = JsonOutput();
  nlohmann::json out;
  // The agent.
  int ready_status = 0;
  auto ready = AgentGet("/readyz", &ready_status);
  auto config = AgentGet("/config");
  nlohmann::json cfg;
  if (config.ok()) cfg = nlohmann::json::parse(*config, nullptr, false);
  const bool up = ready.ok();
  std::string kpr = "unknown (agent down)";
  if (cfg.is_object() && cfg.contains("flags")) {
    const auto& f = cfg["flags"];
    const bool no_k8s =
        f.value("kubeconfig", "").empty() && f.value("k8s_service_host", "").empty() &&
        f.value("ipam_mode", "") != "kubernetes" && !f.value("pod_cidr", "").empty();
    kpr = no_k8s ? "false (static mode: no Kubernetes, so no Services)"
          : f.value("kube_proxy_replacement", "") == "true"
              ? "true (ClusterIP, NodePort, ExternalIP, LoadBalancer, socket LB " +
                    f.value("socket_lb", "?") + ")"
              : "false (--kube_proxy_replacement=false)";
  }
  out["agent"] = {{"up", up},
                  {"address", absl::GetFlag(FLAGS_agent)},
                  {"version", cfg.is_object() ? cfg.value("version", "") : ""},
                  {"ready", up && ready_status == 200},
                  {"readiness", up ? *ready : std::string(ready.status().message())}};
  out["kubeProxyReplacement"] = kpr;
  // The maps.
  auto fill = metrics::ReadMapFill(absl::GetFlag(FLAGS_bpffs_root));
  if (!fill.ok()) {
    std::fprintf(stderr, "sluicectl: %s\n", ExplainPermission(fill.status()).c_str());
    return 1;
  }
  std::map<std::string, metrics::MapFill> by_name;
  for (const auto& f : *fill) by_name[f.name] = f;
  if (by_name.empty()) {
    std::fprintf(stderr, "sluicectl: no Sluice map is pinned under %s (datapath not loaded?)\n",
                 absl::GetFlag(FLAGS_bpffs_root).c_str());
    return 1;
  }
  uint64_t frontends = 0, backends = by_name["sluice_lb4_be"].entries;
  // Frontends with nothing to serve, named (from the agent, or the names it left when down).
  ServiceNames names = LoadServiceNames();
  std::vector<std::string> serving_nothing;
  if (auto svc = maps::Lb4ServiceMap::Open(
          maps::PinPath(absl::GetFlag(FLAGS_bpffs_root), maps::name::sluice_lb4_svc));
      svc.ok()) {
    (void)svc->ForEach([&](const sluice_lb4_key& k, const sluice_lb4_service& v) {
      if (k.backend_slot != 0 || (k.dport == 0 && k.proto == 0)) return;
      ++frontends;
      if (v.count != 0) return;
      const std::string ip = Ip(k.addr);
      const Named* n =
          names.Find(ip, ntohs(k.dport), Proto(k.proto), (v.flags & SLUICE_SVC_F_NODEPORT) != 0);
      std::string line = n ? n->service : absl::StrCat(ip, ":", ntohs(k.dport));
      absl::StrAppend(&line, " (", Proto(k.proto), " ", ip, ":", ntohs(k.dport), ", ",
                      SvcFlags(v.flags), ")");
      if (n && !n->why_empty.empty()) absl::StrAppend(&line, ": ", n->why_empty);
      serving_nothing.push_back(std::move(line));
    });
  }
  std::sort(serving_nothing.begin(), serving_nothing.end());
  Unprogrammed refused = LoadUnprogrammed();
  std::map<std::string, size_t> refused_by_map;
  for (const UnprogrammedFrontend& u : refused.frontends) ++refused_by_map[u.map];
  Ipam ipam = ReadIpam();
  out["ipam"] = {{"podCIDR", ipam.cidr}, {"used", ipam.used}, {"total", ipam.total}};
  // Allocations counted in a directory that may not be the agent's would be zeros posing as
  // facts: without the agent's word or --state_dir, the count is unknown.
  if (!StateDirKnown()) out["ipam"] = {{"podCIDR", ipam.cidr}, {"unknown", AgentNotReached()}};
  out["endpoints"] = by_name["sluice_ep4"].entries;
  out["services"] = {
      {"frontends", frontends},
      {"backends", backends},
      {"named", names.services},
      {"namesFrom", names.unavailable.empty() ? (names.from.empty() ? "agent" : names.from) : ""},
      {"namesUnavailable", names.unavailable},
      {"servingNothing", serving_nothing},
      {"unprogrammed", refused.total},
      {"unprogrammedByMap", refused_by_map}};
  out["maps"] = nlohmann::json::array();
  for (const auto& f : *fill) {
    out["maps"].push_back({{"name", f.name},
                           {"entries", f.entries},
                           {"capacity", f.capacity},
                           {"array", f.is_array}});
  }
  out["programs"] = nlohmann::json::object();
  auto progs = AttachedPrograms();
  for (const auto& [dev, p] : progs) out["programs"][dev] = p;
  uint64_t dropped = 0;
  std::vector<loader::DropTotal> drop_reasons;
  if (auto drops = maps::DropMap::Open(
          maps::PinPath(absl::GetFlag(FLAGS_bpffs_root), maps::name::sluice_drops));
      drops.ok()) {
    if (auto totals = loader::ReadDropTotals(*drops); totals.ok()) {
      for (const auto& t : *totals) {
        if (t.packets == 0) continue;
        dropped += t.packets;
        drop_reasons.push_back(t);
        out["drops"][t.name] = t.packets;
        for (unsigned d = 0; d < SLUICE_DROP_DIR_MAX; ++d) {
          out["dropsByDirection"][t.name][sluice_drop_dir_name(d)] = t.dir_packets[d];
        }
      }
    }
  }
  if (!out.contains("drops")) out["drops"] = nlohmann::json::object();
  if (!out.contains("dropsByDirection")) out["dropsByDirection"] = nlohmann::json::object();
  // What the programs passed on or redirected, per direction (sluice_forward).
  std::vector<loader::ForwardTotal> forwarded;
  if (auto fwd = maps::ForwardMap::Open(
          maps::PinPath(absl::GetFlag(FLAGS_bpffs_root), maps::name::sluice_forward));
      fwd.ok()) {
    if (auto totals = loader::ReadForwardTotals(*fwd); totals.ok()) forwarded = *totals;
  }
  out["forwarded"] = nlohmann::json::object();
  for (const auto& t : forwarded) {
    out["forwarded"][t.name] = {{"packets", t.packets}, {"bytes", t.bytes}};
  }
  // The flow monitor's datapath side: what it emitted and could not (sluice_mon_cpu).
  std::optional<monitor::MonitorCounters> events;
  if (auto cpu = maps::MonitorCpuMap::Open(
          maps::PinPath(absl::GetFlag(FLAGS_bpffs_root), maps::name::sluice_mon_cpu));
      cpu.ok()) {
    if (auto c = monitor::ReadMonitorCounters(*cpu); c.ok()) {
      events = *c;
      out["flowEvents"] = {{"emitted", c->emitted},
                           {"lostRateLimit", c->lost_rate},
                           {"lostRingFull", c->lost_full}};
    }
  }
  // What the agent saw dropped lately (it samples sluice_drops every 10 s).
  nlohmann::json recent;
  if (up) {
    if (auto body = AgentGet("/v1/drops"); body.ok()) {
      recent = nlohmann::json::parse(*body, nullptr, false);
      if (recent.is_object()) out["recentDrops"] = recent;
    }
  }
  // NetworkPolicy not as the policies say (the agent's <state_dir>/policy-status.json).
  nlohmann::json policy = LoadPolicyStatus();
  if (policy.is_object()) {
    out["policy"] = {{"endpoints", policy.value("endpoints", 0)},
                     {"degraded", policy.value("degraded", nlohmann::json::array())},
                     {"invalid", policy.value("invalid", nlohmann::json::array())}};
  }
  if (json) {
    PrintJson(out);
    return 0;
  }

  if (up) {
    std::printf("Agent:                 up, %s, on %s\n",
                out["agent"]["version"].get<std::string>().c_str(),
                absl::GetFlag(FLAGS_agent).c_str());
  } else {
    // No answer may also mean it runs where --agent does not lead (another network namespace).
    std::printf("Agent:                 down, or not on --agent: %s\n",
                ready.status().message().data());
    std::printf("                       (the rest is read from the pinned maps under %s and %s)\n",
                absl::GetFlag(FLAGS_bpffs_root).c_str(), absl::GetFlag(FLAGS_state_dir).c_str());
  }
  if (up) {
    std::printf("Ready:                 %s\n", ready_status == 200 ? "yes" : "no");
    for (absl::string_view line : absl::StrSplit(*ready, '\n', absl::SkipEmpty())) {
      std::printf("                       %s\n", std::string(line).c_str());
    }
  }
  std::printf("KubeProxyReplacement:  %s\n", kpr.c_str());
  if (!StateDirKnown()) {
    std::printf("IPAM:                  unknown: no agent answered and no --state_dir was given\n");
  } else if (!ipam.cidr.empty()) {
    std::printf("IPAM:                  %llu/%llu allocated from %s\n",
                static_cast<unsigned long long>(ipam.used),
                static_cast<unsigned long long>(ipam.total), ipam.cidr.c_str());
  } else {
    std::printf("IPAM:                  no pod CIDR in sluice_node yet\n");
  }
  std::printf("Endpoints:             %llu\n",
              static_cast<unsigned long long>(by_name["sluice_ep4"].entries));
  std::printf("Services:              %llu frontends, %llu backends\n",
              static_cast<unsigned long long>(frontends),
              static_cast<unsigned long long>(backends));
  if (!names.unavailable.empty()) {
    std::printf("                       (names unavailable: %s)\n", names.unavailable.c_str());
  } else {
    std::printf("                       %zu Services named%s%s\n", names.services,
                names.from.empty() ? " by the agent" : " from ", names.from.c_str());
  }
  if (refused.total > 0) {
    std::string maps;
    for (const auto& [m, n] : refused_by_map) absl::StrAppend(&maps, maps.empty() ? "" : ", ", m);
    std::printf(
        "                       %zu frontends not (fully) programmed: %s full "
        "(sluicectl services)\n",
        refused.total, maps.c_str());
  }
  constexpr size_t kShown = 10;
  for (size_t i = 0; i < serving_nothing.size() && i < kShown; ++i) {
    std::printf("                       serves nothing: %s\n", serving_nothing[i].c_str());
  }
  if (serving_nothing.size() > kShown) {
    std::printf("                       ... and %zu more serving nothing (sluicectl services)\n",
                serving_nothing.size() - kShown);
  }
  if (!policy.is_object()) {
    std::printf("Policy:                no status from the agent under %s\n",
                absl::GetFlag(FLAGS_state_dir).c_str());
  } else {
    const nlohmann::json& p = out["policy"];
    std::printf(
        "Policy:                %zu of %llu endpoints degraded (keeping their last complete "
        "policy), %zu invalid policy parts\n",
        p["degraded"].size(), static_cast<unsigned long long>(p["endpoints"].get<uint64_t>()),
        p["invalid"].size());
    for (const auto& d : p["degraded"]) {
      std::printf("                       degraded: %s: %s\n", d.value("pod", "").c_str(),
                  d.value("message", "").c_str());
    }
    for (const auto& i : p["invalid"]) {
      std::printf("                       invalid: %s %s: %s (allows nothing)\n",
                  i.value("policy", "").c_str(), i.value("where", "").c_str(),
                  i.value("reason", "").c_str());
    }
  }
  std::printf("Maps:                  %-18s %9s %9s %6s\n", "NAME", "ENTRIES", "CAPACITY", "FILL");
  for (const auto& f : *fill) {
    if (f.is_array) continue;
    std::printf("                       %-18s %9llu %9u %5.1f%%\n", f.name.c_str(),
                static_cast<unsigned long long>(f.entries), f.capacity,
                f.capacity ? 100.0 * f.entries / f.capacity : 0.0);
  }
  std::printf("Programs:              %s\n",
              progs.empty() ? "none attached in this network namespace" : "");
  for (const auto& [dev, p] : progs)
    std::printf("                       %-16s %s\n", dev.c_str(), p.c_str());
  std::printf("Forwarded:             %s\n",
              forwarded.empty() ? "no sluice_forward pinned" : "since the datapath was loaded:");
  for (const auto& t : forwarded) {
    std::printf("                       %-20s %llu packets, %llu bytes\n", t.name,
                static_cast<unsigned long long>(t.packets),
                static_cast<unsigned long long>(t.bytes));
  }
  std::printf("Drops:                 %llu packets since the datapath was loaded%s\n",
              static_cast<unsigned long long>(dropped), dropped ? ":" : "");
  for (const auto& t : drop_reasons) {
    std::printf("                       %-20s %llu (ingress %llu, egress %llu)\n", t.name,
                static_cast<unsigned long long>(t.packets),
                static_cast<unsigned long long>(t.dir_packets[SLUICE_DROP_DIR_INGRESS]),
                static_cast<unsigned long long>(t.dir_packets[SLUICE_DROP_DIR_EGRESS]));
  }
  if (events) {
    std::printf("Flow events:           %llu emitted, %llu lost (%llu rate-limited, %llu ring full)\n",
                static_cast<unsigned long long>(events->emitted),
                static_cast<unsigned long long>(events->lost()),
                static_cast<unsigned long long>(events->lost_rate),
                static_cast<unsigned long long>(events->lost_full));
  }
  if (recent.is_object() && recent.contains("packets")) {
    uint64_t n = 0;
    for (const auto& [reason, v] : recent["packets"].items()) n += v.get<uint64_t>();
    std::printf("Recent drops:          %llu packets in the last %llds%s\n",
                static_cast<unsigned long long>(n),
                static_cast<long long>(recent.value("windowSeconds", 0)), n ? ":" : "");
    for (const auto& [reason, v] : recent["packets"].items()) {
      std::printf("                       %-20s %llu\n", reason.c_str(),
                  static_cast<unsigned long long>(v.get<uint64_t>()));
    }
  }
  return 0;
}

int Config() {
  auto body = AgentGet("/config");
  if (!body.ok()) {
    std::fprintf(stderr, "sluicectl: %s\n", std::string(body.status().message()).c_str());
    return 1;
  }
  auto j = nlohmann::json::parse(*body, nullptr, false);
  if (JsonOutput() || !j.is_object()) {
    std::printf("%s\n", body->c_str());
    return j.is_object() ? 0 : 1;
  }
  std::printf("version %s\n", j.value("version", "?").c_str());
  for (const auto& [name, value] : j["flags"].items()) {
    std::printf("--%s=%s\n", name.c_str(), value.get<std::string>().c_str());
  }
  return 0;
}

}  // namespace sluice::ctl
