// Maglev consistent hashing (Eisenbud et al., NSDI 2016): a frontend's lookup table of M slots
// (M prime), each naming one of its backends, filled so that every backend holds a share of the
// slots in proportion to its weight and a change of one backend moves few slots of the others.
// The table depends only on the backends' stable identities (address, port, protocol) and
// weights, never on node-local ids or on the order the backends were learnt in, so every node
// computes the same table and sends the same flow (sluice_maglev_flow_hash, maps/lb.h) to the
// same backend without sharing any state.
//
// Pure functions, no kernel: MaglevTable is the agent's; MaglevTableBaseline is the
// straightforward fill as Katran and the paper write it (one 64-bit modulo per probe), kept as
// the reference the unit tests compare against and bench/maglev_bench.cc times.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace sluice::agent {

// Cilium's default; Katran uses 65537.
inline constexpr uint32_t kDefaultMaglevTableSize = 16381;
// The table sizes the agent accepts: primes in this range (a table of M slots costs 4 * M bytes
// per frontend in the datapath).
inline constexpr uint32_t kMinMaglevTableSize = 251;
inline constexpr uint32_t kMaxMaglevTableSize = 131071;

bool IsPrime(uint32_t n);
// OK for a prime in [kMinMaglevTableSize, kMaxMaglevTableSize], else why not.
absl::Status ValidateMaglevTableSize(uint32_t m);

struct MaglevBackend {
  uint32_t addr = 0;   // IPv4, network order (as the maps hold it)
  uint16_t port = 0;   // host order
  uint8_t proto = 0;   // IPPROTO_*
  uint32_t weight = 1;  // 0: takes no slot
};

// The two numbers a backend's permutation of the slots is made from: it prefers slot `offset`
// first, then every `skip`-th slot after it (modulo M; skip in 1..M-1, so with M prime the
// permutation visits every slot once). Hashed from the backend's identity with fixed seeds, so
// the same on every node and every build.
struct MaglevPermutation {
  uint32_t offset = 0;
  uint32_t skip = 1;
};
MaglevPermutation MaglevPermutationOf(const MaglevBackend& b, uint32_t m);

// The table for `backends` with m slots (m prime, as ValidateMaglevTableSize accepts): entry s
// is the index into `backends` of slot s's backend. Backends take turns in the order given
// (sort them by identity first, as the translator does, for a node-independent table); in each
// turn a backend claims the next free slot of its permutation once per max-weight of credit it
// has gathered, so shares follow weights. Empty when no backend has a weight.
std::vector<uint32_t> MaglevTable(const std::vector<MaglevBackend>& backends, uint32_t m);

// The same table, filled as the paper and Katran write it: slot = (offset + j * skip) % m for
// the backend's j-th probe. Slower; the reference for tests and the benchmark's baseline.
std::vector<uint32_t> MaglevTableBaseline(const std::vector<MaglevBackend>& backends, uint32_t m);

}  // namespace sluice::agent
