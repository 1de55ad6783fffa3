#include "agent/routing/overlay.h"

#include "absl/strings/str_cat.h"
#include "agent/kernel/netns.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {

absl::StatusOr<RoutingMode> ParseRoutingMode(absl::string_view text) {
  if (text == "tunnel") return RoutingMode::kTunnel;
  if (text == "native") return RoutingMode::kNative;
  return absl::InvalidArgumentError(
      absl::StrCat("routing mode \"", text, "\": want tunnel or native"));
}

const char* RoutingModeName(RoutingMode mode) {
  return mode == RoutingMode::kTunnel ? "tunnel" : "native";
}

uint32_t PodMtu(RoutingMode mode, uint32_t native_mtu, uint32_t configured) {
  if (configured != 0) return configured;
  if (mode == RoutingMode::kTunnel && native_mtu > kVxlanOverhead) {
    return native_mtu - kVxlanOverhead;
  }
  return native_mtu;
}

absl::StatusOr<int> SetUpOverlay(Netlink& netlink, loader::Datapath& dp, uint16_t port,
                                 uint32_t native_mtu) {
  VxlanSpec spec{.name = kOverlayDevice,
                 .port = port,
                 .mtu = PodMtu(RoutingMode::kTunnel, native_mtu, 0),
                 .alias = kOverlayDeviceMark};
  auto link = netlink.EnsureVxlanDevice(spec);
  if (!link.ok()) return link.status();
  if (auto st = netlink.SetSysctl(InterfaceSysctlPath("ipv4", kOverlayDevice, "rp_filter"), "0");
      !st.ok()) {
    return st;
  }
  if (auto st = dp.AttachOverlay(link->ifindex); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("attach tc ingress on ", kOverlayDevice, ": ", st.message()));
  }
  spdlog::info("overlay: {} (ifindex {}, mtu {}), VXLAN collect_md on UDP {}", kOverlayDevice,
               link->ifindex, spec.mtu, port);
  return link->ifindex;
}

absl::Status RemoveOverlay(Netlink& netlink) {
  auto link = netlink.LinkByName(kOverlayDevice);
  if (absl::IsNotFound(link.status())) return absl::OkStatus();
  if (!link.ok()) return link.status();
  if (link->alias != kOverlayDeviceMark) {
    spdlog::warn("overlay: {} exists without Sluice's mark; left alone", kOverlayDevice);
    return absl::OkStatus();
  }
  spdlog::info("overlay: native routing, removing {} (ifindex {})", kOverlayDevice, link->ifindex);
  return netlink.DeleteLinkByIndex(link->ifindex);
}

}  // namespace sluice::agent
