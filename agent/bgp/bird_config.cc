#include "agent/bgp/bird_config.h"

#include <set>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace sluice::agent::bgp {

absl::StatusOr<BgpPeer> ParseBgpPeer(absl::string_view text) {
  std::vector<absl::string_view> f = absl::StrSplit(text, ':');
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("BGP peer \"", text, "\": ", why, " (want ADDRESS:ASN[:HOLD[:KEEPALIVE]])"));
  };
  if (f.size() < 2 || f.size() > 4) return bad("wrong number of fields");
  BgpPeer peer;
  auto address = IpAddress::Parse(f[0]);
  if (!address.ok() || !address->is_v4()) return bad("not an IPv4 address");
  peer.address = *address;
  if (!absl::SimpleAtoi(f[1], &peer.asn) || peer.asn == 0) return bad("ASN not in 1..4294967295");
  if (f.size() > 2) {
    if (!absl::SimpleAtoi(f[2], &peer.hold_time) ||
        (peer.hold_time != 0 && (peer.hold_time < 3 || peer.hold_time > 65535))) {
      return bad("hold time not 0 or 3..65535 seconds");
    }
    // RFC 4271's suggestion: a third of the hold time.
    peer.keepalive_time = peer.hold_time / 3;
  }
  if (f.size() > 3) {
    if (!absl::SimpleAtoi(f[3], &peer.keepalive_time) ||
        (peer.hold_time != 0 && peer.keepalive_time >= peer.hold_time)) {
      return bad("keepalive time not below the hold time");
    }
  }
  return peer;
}

std::string PeerProtocolName(const IpAddress& address) {
  return absl::StrCat("peer_", absl::StrReplaceAll(address.ToString(), {{".", "_"}}));
}

absl::StatusOr<std::string> RenderBirdConfig(const BgpOptions& options, const IpAddress& router_id,
                                             const std::vector<IpPrefix>& pod_cidrs) {
  if (!router_id.is_v4()) return absl::InvalidArgumentError("BGP router id: not IPv4");
  if (options.local_asn == 0) return absl::InvalidArgumentError("BGP local ASN 0");
  for (const auto& [what, text] : {std::pair{"BGP password", &options.password},
                                   std::pair{"BIRD's log file", &options.log_file}}) {
    for (char c : *text) {
      if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": a double quote, backslash or control character cannot be configured"));
      }
    }
  }
  std::string out = absl::StrCat(
      "# Written by sluice-agent (agent/bgp): every change is lost at its next start.\n",
      "router id ", router_id.ToString(), ";\n",
      options.log_file.empty()
          ? std::string("log syslog all;\n")
          : absl::StrCat("log \"", options.log_file, "\" { info, warning, error, fatal };\n"),
      "\n", "protocol device { scan time 10; }\n\n",
      "# Routes the peers announce, into the main table. Graceful restart: after `bird -R` the\n"
      "# routes already in the kernel stay until they are learned again.\n",
      "protocol kernel sluice_kernel {\n",
      "  ipv4 { import none; export where source = RTS_BGP; };\n",
      "  merge paths on;\n  graceful restart on;\n  persist on;\n}\n\n",
      "# This node's pod CIDR(s): announced, never installed.\n",
      "protocol static sluice_pod_cidrs {\n  ipv4;\n");
  for (const auto& cidr : pod_cidrs) {
    if (!cidr.network().is_v4()) continue;  // IPv6 pods are not yet (docs/routing.md)
    absl::StrAppend(&out, "  route ", cidr.ToString(), " blackhole;\n");
  }
  absl::StrAppend(&out, "}\n\n", "template bgp sluice_peer {\n  local as ", options.local_asn,
                  ";\n", "  graceful restart on;\n  graceful restart time ",
                  options.graceful_restart_time, ";\n");
  if (!options.password.empty()) absl::StrAppend(&out, "  password \"", options.password, "\";\n");
  absl::StrAppend(&out, "  ipv4 { import all; export where proto = \"sluice_pod_cidrs\"; };\n}\n");
  std::set<std::string> seen;
  for (const auto& peer : options.peers) {
    std::string name = PeerProtocolName(peer.address);
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("BGP peer ", peer.address.ToString(), " given twice"));
    }
    absl::StrAppend(&out, "\nprotocol bgp ", name, " from sluice_peer {\n  neighbor ",
                    peer.address.ToString(), " as ", peer.asn, ";\n  hold time ", peer.hold_time,
                    ";\n  keepalive time ", peer.keepalive_time, ";\n}\n");
  }
  return out;
}

}  // namespace sluice::agent::bgp
