// The ports no Service backend is on (sluice_lb4_nbport, maps/lb.h): with a port's bit set, the
// datapath skips the reverse NAT lookup for packets from it, so pod -> pod traffic that is no
// Service's pays no conntrack lookup. A set bit must never be wrong; a clear one costs only that
// lookup. Both the agent's ServiceReconciler and the tests and benchmarks that program Services
// directly keep the map through this class.
#pragma once

#include <bitset>
#include <cstdint>
#include <initializer_list>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "maps/sluice_maps.h"

namespace sluice::loader {

class NonBackendPorts {
 public:
  explicit NonBackendPorts(maps::Lb4NonBackendPortMap& map) : map_(map) {}

  // Call before a backend on `port` (network byte order) is written: clears its bit, once per
  // port for the life of this object.
  [[nodiscard]] absl::Status Claim(uint16_t port);

  // Sets the bit of every port except those in `backend_ports` (network byte order: the
  // backends that are programmed) and the backend ports of translated flows in `conntrack`
  // (their reply entries' source ports), and clears the bits of those. The caller must not write
  // new backends meanwhile. Returns how many ports are vouched for.
  [[nodiscard]] absl::StatusOr<size_t> Vouch(const absl::flat_hash_set<uint16_t>& backend_ports,
                                             std::initializer_list<maps::Ct4Map*> conntrack);

 private:
  maps::Lb4NonBackendPortMap& map_;
  std::bitset<65536> claimed_;  // host byte order
};

}  // namespace sluice::loader
