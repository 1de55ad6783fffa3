#include "agent/service/maglev.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice::agent {
namespace {

constexpr uint32_t kFree = UINT32_MAX;

// FNV-1a over the identity's bytes from a seed, then splitmix64's finaliser: fixed, portable and
// well mixed (absl::Hash is seeded per process, which would give every node its own table).
uint64_t IdentityHash(const MaglevBackend& b, uint64_t seed) {
  const uint8_t bytes[7] = {
      static_cast<uint8_t>(b.addr), static_cast<uint8_t>(b.addr >> 8),
      static_cast<uint8_t>(b.addr >> 16), static_cast<uint8_t>(b.addr >> 24),
      static_cast<uint8_t>(b.port >> 8), static_cast<uint8_t>(b.port), b.proto,
  };
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (uint8_t c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

constexpr uint64_t kOffsetSeed = 0x6d61676c65766f66ull;  // "maglevof"
constexpr uint64_t kSkipSeed = 0x6d61676c65767369ull;    // "maglevsi"

uint32_t MaxWeight(const std::vector<MaglevBackend>& backends) {
  uint32_t w = 0;
  for (const MaglevBackend& b : backends) w = std::max(w, b.weight);
  return w;
}

}  // namespace

bool IsPrime(uint32_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (uint32_t d = 3; uint64_t{d} * d <= n; d += 2) {
    if (n % d == 0) return false;
  }
  return true;
}

absl::Status ValidateMaglevTableSize(uint32_t m) {
  if (m < kMinMaglevTableSize || m > kMaxMaglevTableSize) {
    return absl::InvalidArgumentError(absl::StrCat("Maglev table size ", m, ": want a prime in ",
                                                   kMinMaglevTableSize, " .. ",
                                                   kMaxMaglevTableSize));
  }
  if (!IsPrime(m)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Maglev table size ", m, " is not prime (e.g. 16381, 65521, 65537)"));
  }
  return absl::OkStatus();
}

MaglevPermutation MaglevPermutationOf(const MaglevBackend& b, uint32_t m) {
  MaglevPermutation p;
  p.offset = static_cast<uint32_t>(IdentityHash(b, kOffsetSeed) % m);
  p.skip = m > 1 ? static_cast<uint32_t>(IdentityHash(b, kSkipSeed) % (m - 1)) + 1 : 1;
  return p;
}

// Each backend walks its permutation with one add and one compare per probe (no division), and
// a probe reads a bitmap of the claimed slots (8 KiB for 65537 slots: it stays in the L1 cache,
// where the table itself does not); a turn with all weights equal skips the credit arithmetic.
// Otherwise the same turns, probes and claims as MaglevTableBaseline, so the same table.
std::vector<uint32_t> MaglevTable(const std::vector<MaglevBackend>& backends, uint32_t m) {
  const uint32_t max_weight = MaxWeight(backends);
  if (max_weight == 0 || m == 0) return {};
  struct Walk {
    uint32_t pos;
    uint32_t skip;
    uint32_t index;
    uint32_t weight;
    uint64_t credit;
  };
  std::vector<Walk> walks;
  walks.reserve(backends.size());
  bool equal = true;
  for (uint32_t i = 0; i < backends.size(); ++i) {
    if (backends[i].weight == 0) continue;
    MaglevPermutation p = MaglevPermutationOf(backends[i], m);
    walks.push_back({p.offset, p.skip, i, backends[i].weight, 0});
    equal &= backends[i].weight == max_weight;
  }
  std::vector<uint32_t> table(m, kFree);
  std::vector<uint64_t> claimed((m + 63) / 64, 0);
  uint32_t* const t = table.data();
  uint64_t* const bits = claimed.data();
  uint32_t filled = 0;
  for (;;) {
    for (Walk& w : walks) {
      if (!equal) {
        w.credit += w.weight;
        if (w.credit < max_weight) continue;
        w.credit -= max_weight;
      }
      uint32_t c = w.pos;
      while ((bits[c >> 6] >> (c & 63)) & 1) {
        c += w.skip;
        if (c >= m) c -= m;
      }
      bits[c >> 6] |= uint64_t{1} << (c & 63);
      t[c] = w.index;
      c += w.skip;
      if (c >= m) c -= m;
      w.pos = c;
      if (++filled == m) return table;
    }
  }
}

std::vector<uint32_t> MaglevTableBaseline(const std::vector<MaglevBackend>& backends,
                                          uint32_t m) {
  const uint32_t max_weight = MaxWeight(backends);
  if (max_weight == 0 || m == 0) return {};
  const size_t n = backends.size();
  std::vector<MaglevPermutation> perm(n);
  for (size_t i = 0; i < n; ++i) perm[i] = MaglevPermutationOf(backends[i], m);
  std::vector<uint64_t> next(n, 0);
  std::vector<uint64_t> credit(n, 0);
  std::vector<uint32_t> table(m, kFree);
  uint32_t filled = 0;
  for (;;) {
    for (size_t i = 0; i < n; ++i) {
      if (backends[i].weight == 0) continue;
      credit[i] += backends[i].weight;
      if (credit[i] < max_weight) continue;
      credit[i] -= max_weight;
      uint64_t c = (perm[i].offset + next[i] * perm[i].skip) % m;
      while (table[c] != kFree) {
        ++next[i];
        c = (perm[i].offset + next[i] * perm[i].skip) % m;
      }
      table[c] = static_cast<uint32_t>(i);
      ++next[i];
      if (++filled == m) return table;
    }
  }
}

}  // namespace sluice::agent
