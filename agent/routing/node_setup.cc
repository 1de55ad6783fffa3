#include "agent/routing/node_setup.h"

#include <arpa/inet.h>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {

absl::Status ParsePortRange(absl::string_view text, uint16_t* min, uint16_t* max) {
  std::vector<std::string> parts = absl::StrSplit(text, '-');
  uint32_t lo = 0, hi = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &lo) || !absl::SimpleAtoi(parts[1], &hi) ||
      lo < 1024 || hi > 65535 || lo > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("port range \"", text, "\": want MIN-MAX within 1024-65535"));
  }
  *min = static_cast<uint16_t>(lo);
  *max = static_cast<uint16_t>(hi);
  return absl::OkStatus();
}

absl::Status ReconcileNoMasquerade(maps::NoMasqMap& nomasq, const std::vector<IpPrefix>& want,
                                   bool allow_deletes) {
  std::set<std::pair<uint32_t, uint32_t>> keys;
  for (const auto& p : want) {
    keys.insert({static_cast<uint32_t>(p.length()), htonl(p.network().v4_host_order())});
  }
  // What is there already is not written again; the new prefixes go in before the stale ones go
  // (a prefix replaced by a wider one stays covered throughout).
  std::set<std::pair<uint32_t, uint32_t>> have;
  auto st = nomasq.ForEach([&](const sluice_lpm4_key& k, const uint8_t&) {
    have.insert({k.prefixlen, k.addr});
  });
  if (!st.ok()) return st;
  auto add_missing = [&]() -> absl::Status {
    for (const auto& [len, addr] : keys) {
      if (have.contains({len, addr})) continue;
      if (auto up = nomasq.Update(sluice_lpm4_key{len, addr}, 1); !up.ok()) return up;
    }
    return absl::OkStatus();
  };
  absl::Status added = add_missing();
  if (allow_deletes) {
    for (const auto& [len, addr] : have) {
      if (keys.contains({len, addr})) continue;
      if (auto del = nomasq.Delete(sluice_lpm4_key{len, addr}); !del.ok()) return del;
    }
    // A full map (the prefixes of an earlier agent that did not merge them) has room now.
    if (!added.ok()) added = add_missing();
  }
  return added;
}

absl::StatusOr<Node> SetUpNode(Netlink& netlink, loader::Datapath& dp, const NodeOptions& options,
                               const IpAddress& gateway, bool prune_nomasq) {
  Node node;
  node.pod_cidr = options.pod_cidr;
  node.gateway = gateway;
  node.native_device = options.native_device;
  if (node.native_device.empty()) {
    auto dev = netlink.DefaultRouteDevice();
    if (!dev.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no --native_device given and no IPv4 default route to find it: ",
          dev.status().message()));
    }
    node.native_device = *dev;
  }
  auto link = netlink.LinkByName(node.native_device);
  if (!link.ok()) return link.status();
  node.native_ifindex = link->ifindex;
  node.native_mtu = link->mtu;
  if (!options.node_ip.empty()) {
    auto ip = IpAddress::Parse(options.node_ip);
    if (!ip.ok()) return ip.status();
    node.node_ip = *ip;
  } else {
    auto ip = netlink.FirstIPv4Address(node.native_device);
    if (!ip.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "native device ", node.native_device, " has no IPv4 address and no --node_ip given"));
    }
    node.node_ip = *ip;
  }

  if (auto st = netlink.SetSysctl("net.ipv4.ip_forward", "1"); !st.ok()) return st;
  if (options.routing_mode == RoutingMode::kTunnel) {
    auto ifindex = SetUpOverlay(netlink, dp, options.tunnel_port, node.native_mtu);
    if (!ifindex.ok()) return ifindex.status();
    node.tunnel_ifindex = *ifindex;
  }

  sluice_node_config cfg{};
  cfg.node_ip4 = htonl(node.node_ip.v4_host_order());
  cfg.pod_cidr4 = htonl(node.pod_cidr.network().v4_host_order());
  cfg.pod_cidr4_len = static_cast<uint8_t>(node.pod_cidr.length());
  cfg.gateway_ip4 = htonl(gateway.v4_host_order());
  cfg.flags = options.masquerade ? SLUICE_NODE_F_MASQUERADE : 0;
  cfg.nat_port_min = options.nat_port_min;
  cfg.nat_port_max = options.nat_port_max;
  if (options.service_cidr.has_value()) {
    cfg.service_cidr4 = htonl(options.service_cidr->network().v4_host_order());
    cfg.service_cidr4_len = static_cast<uint8_t>(options.service_cidr->length());
  }
  cfg.tunnel_ifindex = static_cast<uint32_t>(node.tunnel_ifindex);
  if (node.tunnel_ifindex != 0) {
    cfg.tunnel_mtu = static_cast<uint16_t>(PodMtu(RoutingMode::kTunnel, node.native_mtu, 0));
    cfg.tunnel_port = options.tunnel_port;
  }
  if (auto st = dp.node_config().Update(0, cfg); !st.ok()) return st;
  // Native routing: the device of an earlier tunnel-mode run goes once nothing sends to it.
  if (options.routing_mode == RoutingMode::kNative) {
    if (auto st = RemoveOverlay(netlink); !st.ok()) return st;
  }

  // Desired never-masqueraded destinations; entries of an earlier configuration are removed.
  std::vector<IpPrefix> nomasq = options.non_masquerade_cidrs;
  nomasq.push_back(node.pod_cidr);
  if (auto st = ReconcileNoMasquerade(dp.nomasq(), nomasq, prune_nomasq); !st.ok()) return st;

  if (auto att = dp.AttachNative(node.native_ifindex); !att.ok()) return att;
  spdlog::info("node: native device {} (ifindex {}, mtu {}), node address {}, pod CIDR {}, "
               "gateway {}, masquerade {} ports {}-{}, routing {}",
               node.native_device, node.native_ifindex, node.native_mtu,
               node.node_ip.ToString(), node.pod_cidr.ToString(), gateway.ToString(),
               options.masquerade ? "on" : "off", options.nat_port_min, options.nat_port_max,
               RoutingModeName(options.routing_mode));
  return node;
}

}  // namespace sluice::agent
