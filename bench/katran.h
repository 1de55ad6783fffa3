// Facebook's Katran, timed beside Sluice in lb_packet_bench (--katran_obj): its XDP balancer,
// built from Katran's own sources outside this repository (bench/README.md says how), loaded from
// the object file and programmed as Katran's user space (katran/lib/KatranLb.cpp) programs it for
// one VIP and its reals: the per-CPU connection tables (LRU hashes) in lru_mapping, the default
// router's MAC in ctl_array, the VIP in vip_map, the reals in `reals` and the VIP's consistent
// hashing ring in ch_rings. Nothing of Katran is part of Sluice: only the layouts of the map
// entries written here, which are checked against the object's own key and value sizes.
#pragma once

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "support/packet.h"

namespace sluice::bench {

// Katran's map entries (katran/lib/bpf/balancer_structs.h), IPv4 in the first word of each
// address union.
struct KatranVip {  // vip_map key: vip_definition
  uint32_t addr[4];
  uint16_t port;  // network order, as the datapath reads it from the TCP header
  uint8_t proto;
  uint8_t pad;
};
struct KatranVipMeta {  // vip_map value: vip_meta
  uint32_t flags;
  uint32_t vip_num;  // the VIP's ring in ch_rings and its stats slot
};
struct KatranReal {  // reals value: real_definition
  uint32_t addr[4];
  uint8_t flags;  // F_IPV6 (bit 0) for an IPv6 real; IPv4 reals get IPIP
  uint8_t pad[3];
};
struct KatranFlowKey {  // the connection table's key: flow_key
  uint32_t src[4];
  uint32_t dst[4];
  uint16_t sport, dport;
  uint8_t proto;
  uint8_t pad[3];
};
struct KatranLruValue {  // the connection table's value: real_pos_lru
  uint32_t pos;
  uint32_t pad;
  uint64_t atime;
};
static_assert(sizeof(KatranVip) == 20 && sizeof(KatranVipMeta) == 8 && sizeof(KatranReal) == 20 &&
              sizeof(KatranFlowKey) == 40 && sizeof(KatranLruValue) == 16);

// Katran's constants (balancer_consts.h) in the build bench/README.md describes.
inline constexpr uint32_t kKatranRingSize = 65537;
inline constexpr int kXdpTx = 3;

class Katran {
 public:
  // Loads balancer.bpf.c's object from `path` and programs the VIP vip:port/TCP with `reals`
  // (network order), each CPU's connection table holding up to lru_size flows, and `router_mac`
  // as the MAC of the default router every encapsulated packet is sent to.
  static absl::StatusOr<std::unique_ptr<Katran>> Load(const std::string& path, uint32_t vip,
                                                      uint16_t port,
                                                      const std::vector<uint32_t>& reals,
                                                      uint32_t lru_size,
                                                      const testing::Mac& router_mac) {
    std::unique_ptr<Katran> k(new Katran());
    k->obj_ = bpf_object__open_file(path.c_str(), nullptr);
    if (!k->obj_) return Errno(absl::StrCat("open ", path));
    // Katran's loader (BpfLoader) loads every program of the object as XDP.
    struct bpf_program* prog = bpf_object__find_program_by_name(k->obj_, "balancer_ingress");
    if (!prog) return absl::NotFoundError(absl::StrCat(path, ": no program balancer_ingress"));
    bpf_program__set_type(prog, BPF_PROG_TYPE_XDP);
    if (int err = bpf_object__load(k->obj_); err) {
      errno = -err;
      return Errno(absl::StrCat("load ", path, " (libbpf printed the verifier's log)"));
    }
    k->prog_fd_ = bpf_program__fd(prog);
    if (auto st = k->Program(vip, port, reals, lru_size, router_mac); !st.ok()) return st;
    return k;
  }

  ~Katran() {
    for (int fd : lru_fds_) close(fd);
    if (obj_) bpf_object__close(obj_);
  }

  int prog_fd() const { return prog_fd_; }
  uint32_t real(size_t i) const { return reals_[i]; }
  size_t reals() const { return reals_.size(); }

  // Deletes every flow of the connection tables but `keep` (network order client address and
  // port); returns how many were deleted.
  absl::StatusOr<size_t> ClearFlows(uint32_t keep_addr, uint16_t keep_port) {
    size_t deleted = 0;
    for (int fd : lru_fds_) {
      std::vector<KatranFlowKey> keys;
      KatranFlowKey key{}, next{};
      const KatranFlowKey* cur = nullptr;
      while (bpf_map_get_next_key(fd, cur, &next) == 0) {
        if (!(next.src[0] == keep_addr && next.sport == keep_port)) keys.push_back(next);
        key = next;
        cur = &key;
      }
      for (const auto& k : keys) {
        if (bpf_map_delete_elem(fd, &k) != 0) return Errno("delete a Katran flow");
        ++deleted;
      }
    }
    return deleted;
  }

 private:
  Katran() = default;

  static absl::Status Errno(const std::string& what) {
    return absl::Status(absl::StatusCode::kInternal,
                        absl::StrCat(what, ": ", std::strerror(errno)));
  }

  struct bpf_map* Map(const char* name, size_t key_size, size_t value_size, absl::Status* st) {
    struct bpf_map* m = bpf_object__find_map_by_name(obj_, name);
    if (!m) {
      *st = absl::NotFoundError(absl::StrCat("Katran object has no map ", name));
    } else if (bpf_map__key_size(m) != key_size || bpf_map__value_size(m) != value_size) {
      *st = absl::FailedPreconditionError(absl::StrCat(
          "Katran map ", name, ": key/value ", bpf_map__key_size(m), "/", bpf_map__value_size(m),
          " bytes, this bench writes ", key_size, "/", value_size));
      m = nullptr;
    }
    return m;
  }

  absl::Status Program(uint32_t vip, uint16_t port, const std::vector<uint32_t>& reals,
                       uint32_t lru_size, const testing::Mac& router_mac) {
    absl::Status st;
    auto* lru_mapping = Map("lru_mapping", 4, 4, &st);
    auto* ctl_array = Map("ctl_array", 4, 8, &st);
    auto* vip_map = Map("vip_map", sizeof(KatranVip), sizeof(KatranVipMeta), &st);
    auto* reals_map = Map("reals", 4, sizeof(KatranReal), &st);
    auto* ch_rings = Map("ch_rings", 4, 4, &st);
    if (!st.ok()) return st;
    // One connection table per CPU, as KatranLb::initLrus makes them for the forwarding cores
    // (here every possible CPU, so wherever the bench runs).
    int cpus = libbpf_num_possible_cpus();
    if (cpus <= 0 || static_cast<uint32_t>(cpus) > bpf_map__max_entries(lru_mapping))
      return absl::FailedPreconditionError(absl::StrCat(cpus, " CPUs for Katran's lru_mapping"));
    for (int cpu = 0; cpu < cpus; ++cpu) {
      std::string name = absl::StrCat("katran_lru", cpu);
      int fd = bpf_map_create(BPF_MAP_TYPE_LRU_HASH, name.c_str(), sizeof(KatranFlowKey),
                              sizeof(KatranLruValue), lru_size, nullptr);
      if (fd < 0) return Errno(absl::StrCat("create ", name));
      lru_fds_.push_back(fd);
      uint32_t key = static_cast<uint32_t>(cpu);
      if (bpf_map_update_elem(bpf_map__fd(lru_mapping), &key, &fd, BPF_ANY) != 0)
        return Errno(absl::StrCat("lru_mapping[", cpu, "]"));
    }
    // The default router's MAC (KatranLb's kMacAddrPos, 0).
    uint8_t ctl[8] = {};
    std::memcpy(ctl, router_mac.data(), 6);
    uint32_t zero = 0;
    if (bpf_map_update_elem(bpf_map__fd(ctl_array), &zero, ctl, BPF_ANY) != 0)
      return Errno("ctl_array[0]");
    // Reals from index 1 (KatranLb never gives out 0: a ring slot of 0 is an empty one).
    for (size_t i = 0; i < reals.size(); ++i) {
      KatranReal r{};
      r.addr[0] = reals[i];
      uint32_t idx = static_cast<uint32_t>(i + 1);
      if (bpf_map_update_elem(bpf_map__fd(reals_map), &idx, &r, BPF_ANY) != 0)
        return Errno(absl::StrCat("reals[", idx, "]"));
      reals_.push_back(reals[i]);
    }
    // The VIP's ring (vip_num 0: slots 0 .. kKatranRingSize - 1). KatranLb fills it with Maglev;
    // here the reals take turns, which spreads flows as evenly. What the datapath does per packet
    // (hash the flow, one array lookup) does not depend on what the ring holds.
    std::vector<uint32_t> ring_keys(kKatranRingSize), ring_values(kKatranRingSize);
    for (uint32_t s = 0; s < kKatranRingSize; ++s) {
      ring_keys[s] = s;
      ring_values[s] = 1 + s % static_cast<uint32_t>(reals.size());
    }
    uint32_t count = kKatranRingSize;
    if (bpf_map_update_batch(bpf_map__fd(ch_rings), ring_keys.data(), ring_values.data(), &count,
                             nullptr) != 0)
      return Errno("ch_rings");
    // The VIP last, as KatranLb adds it once its reals and ring are in place.
    KatranVip v{};
    v.addr[0] = vip;
    v.port = htons(port);
    v.proto = IPPROTO_TCP;
    KatranVipMeta meta{0, 0};
    if (bpf_map_update_elem(bpf_map__fd(vip_map), &v, &meta, BPF_ANY) != 0) return Errno("vip_map");
    return absl::OkStatus();
  }

  struct bpf_object* obj_ = nullptr;
  int prog_fd_ = -1;
  std::vector<int> lru_fds_;
  std::vector<uint32_t> reals_;
};

}  // namespace sluice::bench
