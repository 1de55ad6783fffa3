#include "loader/backend_ports.h"

#include <arpa/inet.h>

#include <vector>

#include "absl/strings/str_cat.h"

namespace sluice::loader {

absl::Status NonBackendPorts::Claim(uint16_t port) {
  const uint16_t p = ntohs(port);
  if (claimed_.test(p)) return absl::OkStatus();
  const __u32 word = p >> 5;
  absl::StatusOr<__u32> bits = map_.Lookup(word);
  if (!bits.ok()) return bits.status();
  if (*bits & (1u << (p & 31))) {
    absl::Status st = map_.Update(word, *bits & ~(1u << (p & 31)));
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("port ", p, ": ", st.message()));
  }
  claimed_.set(p);
  return absl::OkStatus();
}

absl::StatusOr<size_t> NonBackendPorts::Vouch(const absl::flat_hash_set<uint16_t>& backend_ports,
                                              std::initializer_list<maps::Ct4Map*> conntrack) {
  std::bitset<65536> used;
  for (uint16_t port : backend_ports) used.set(ntohs(port));
  for (maps::Ct4Map* ct : conntrack) {
    if (ct == nullptr) continue;
    absl::Status st = ct->ForEachBatch([&](const sluice_ct4_key& k, const sluice_ct4_entry& e) {
      if (e.rev_nat_id == 0) return;  // no translated flow (a policy-tracked one)
      if (k.dir == SLUICE_CT_DIR_REPLY) used.set(ntohs(k.sport));
      if (e.backend_port != 0) used.set(ntohs(e.backend_port));
    });
    if (!st.ok()) return st;
  }
  std::vector<__u32> words(SLUICE_LB4_NBPORT_WORDS), bits(SLUICE_LB4_NBPORT_WORDS);
  size_t vouched = 0;
  for (__u32 w = 0; w < SLUICE_LB4_NBPORT_WORDS; ++w) {
    words[w] = w;
    for (unsigned b = 0; b < 32; ++b) {
      if (!used.test(w * 32 + b)) {
        bits[w] |= 1u << b;
        ++vouched;
      }
    }
  }
  size_t done = 0;
  absl::Status st = map_.UpdateBatch(words.data(), bits.data(), words.size(), &done);
  if (!st.ok()) return st;
  claimed_ = used;
  return vouched;
}

}  // namespace sluice::loader
