// Tunnel mode's device (docs/routing.md): one collect_md VXLAN device per node, `sluice_vxlan`,
// marked as Sluice's, with sluice_from_overlay on its TC ingress. Native mode removes it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/kernel/netlink.h"
#include "loader/datapath.h"

namespace sluice::agent {

// routingMode, Cilium's names.
enum class RoutingMode { kTunnel, kNative };

// Parses "tunnel" or "native".
[[nodiscard]] absl::StatusOr<RoutingMode> ParseRoutingMode(absl::string_view text);
const char* RoutingModeName(RoutingMode mode);

inline constexpr char kOverlayDevice[] = "sluice_vxlan";
// The device's IFLA_IFALIAS. Not kSluiceLinkMarkPrefix ("sluice:"), which marks pod veths that
// endpoint GC deletes when no record names them.
inline constexpr char kOverlayDeviceMark[] = "sluice-overlay";
inline constexpr uint16_t kDefaultTunnelPort = 8472;
// Outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14).
inline constexpr uint32_t kVxlanOverhead = 50;

// The pods' MTU: `configured` if set, else the native device's, less the encapsulation in
// tunnel mode.
uint32_t PodMtu(RoutingMode mode, uint32_t native_mtu, uint32_t configured);

// Creates or keeps the VXLAN device on UDP `port` with MTU native_mtu - 50, turns rp_filter off
// on it (decapsulated sources are pods whose reverse route is not the tunnel) and attaches the
// receive program. Returns the device's ifindex. Idempotent.
[[nodiscard]] absl::StatusOr<int> SetUpOverlay(Netlink& netlink, loader::Datapath& dp,
                                               uint16_t port, uint32_t native_mtu);

// Native mode: deletes the device of an earlier tunnel-mode run when it carries the mark. Absent
// is not an error; an unmarked link of that name is left alone.
[[nodiscard]] absl::Status RemoveOverlay(Netlink& netlink);

}  // namespace sluice::agent
