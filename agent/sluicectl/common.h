// What every sluicectl subcommand shares: the --bpffs_root flag, opening pinned maps, and how
// addresses, MACs and protocols are printed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "maps/sluice_maps.h"

ABSL_DECLARE_FLAG(std::string, bpffs_root);

namespace sluice::ctl {

std::string Ip(uint32_t be);         // network-order IPv4 -> "10.0.0.1"
std::string Mac(const uint8_t* m);   // "aa:bb:cc:dd:ee:ff"
const char* Proto(uint8_t p);        // "tcp", "udp", "icmp", "?"

// Opens the pinned map `name` under --bpffs_root, or exits 1 with the reason.
template <typename M>
M OpenOrDie(const char* name) {
  auto m = M::Open(maps::PinPath(absl::GetFlag(FLAGS_bpffs_root), name));
  if (!m.ok()) {
    std::fprintf(stderr, "sluicectl: %s\n", std::string(m.status().message()).c_str());
    std::exit(1);
  }
  return std::move(*m);
}

// The subcommands; each returns the process exit code.
int Drops();
int Endpoints();
int Nat();
int Services();
int Identities();
int Policy(const std::vector<std::string>& args);  // args after "policy"
int Observe(const std::vector<std::string>& args);  // args after "observe" (its own options)

}  // namespace sluice::ctl
