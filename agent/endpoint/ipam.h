// Host-local IPAM over the node's pod CIDR: next-fit allocation, one file per address in the
// state directory (created O_EXCL, fsync'd), so an agent restart neither loses nor duplicates an
// address. IPv4 today; the address and prefix types already carry IPv6.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/base/net.h"

namespace sluice::agent {

// Who holds an address: one interface of one container in one network (CNI's attachment key).
struct IpamOwner {
  std::string network;  // CNI network name; may be empty
  std::string container_id;
  std::string ifname;

  friend auto operator<=>(const IpamOwner&, const IpamOwner&) = default;
  std::string ToString() const;  // "network/container_id/ifname", for logs and errors
};

struct IpamAllocation {
  IpAddress address;
  IpamOwner owner;

  friend bool operator==(const IpamAllocation&, const IpamAllocation&) = default;
};

// Thread-safe; the mutex is never held across disk I/O, so a stalled write delays only the
// request that makes it. Exactly one Ipam may be open over a state directory at a time (flock), so two
// agents never hand out the same address.
//
// On disk: <state_dir>/ipam/<network>_<len>/ holds one file per allocated address, named by the
// address and containing the owner as JSON, plus `last_reserved` (the next-fit cursor, replaced
// atomically) and `lock`. Allocations found in the directory of a previous pod CIDR are adopted
// when the address is inside the new CIDR and otherwise kept as "foreign": reported, never handed
// out, and freed by ReleaseAllExcept when their owner is gone.
class Ipam {
 public:
  using Owner = IpamOwner;
  using Allocation = IpamAllocation;

  // Opens (creating as needed) the allocator for `pod_cidr` in `state_dir`. IPv4 prefixes from /8
  // to /30; IPv6 returns Unimplemented for now.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Ipam>> Open(absl::string_view state_dir,
                                                                  const IpPrefix& pod_cidr);
  ~Ipam();
  Ipam(const Ipam&) = delete;
  Ipam& operator=(const Ipam&) = delete;

  const IpPrefix& cidr() const { return cidr_; }
  // The first usable address: reserved for the node side, the pods' default route.
  const IpAddress& gateway() const { return gateway_; }
  // Addresses that can be handed out (the CIDR minus network, broadcast and gateway).
  uint64_t capacity() const { return capacity_; }

  // Returns the owner's address, allocating the next free one after the cursor if it has none.
  // Same owner again -> same address (a retried CNI ADD). ResourceExhausted when the CIDR is full.
  [[nodiscard]] absl::StatusOr<IpAddress> Allocate(const Owner& owner) ABSL_LOCKS_EXCLUDED(mu_);
  // Holds `address` for `owner`, as start-up reconciliation does for each live endpoint (its veth
  // and record exist): re-persists a reservation whose file is gone, and moves an owner whose
  // reservation names another address to this one. FailedPrecondition if another owner holds
  // it (two live claims: nothing is changed), InvalidArgument outside the CIDR.
  [[nodiscard]] absl::Status Reserve(const Owner& owner, const IpAddress& address)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the reservation of `address` for `owner` is on disk as well as in memory (CHECK):
  // NotFound when its file is gone, DataLoss when the file names someone else or is unreadable.
  [[nodiscard]] absl::Status VerifyPersisted(const Owner& owner, const IpAddress& address) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Frees every address `owner` holds (in this CIDR or a foreign one). Absent owner: OK.
  [[nodiscard]] absl::Status Release(const Owner& owner) ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<IpAddress> Lookup(const Owner& owner) const ABSL_LOCKS_EXCLUDED(mu_);
  // Allocations in the current CIDR, ordered by address.
  std::vector<Allocation> Allocated() const ABSL_LOCKS_EXCLUDED(mu_);
  // Allocations left over from a previous pod CIDR that lie outside the current one.
  std::vector<Allocation> Foreign() const ABSL_LOCKS_EXCLUDED(mu_);
  // Addresses whose file could not be read or parsed: held (never reused, never GC'd) until an
  // operator removes the file. Counted for metrics.
  std::vector<IpAddress> Unreadable() const ABSL_LOCKS_EXCLUDED(mu_);

  // Garbage collection (CNI GC, start-up reconciliation): frees every allocation, current or
  // foreign, whose owner is not in `live`, and any second address held by a live owner. Returns
  // what was freed. On an I/O error it still frees what it can, then returns the first error.
  [[nodiscard]] absl::StatusOr<std::vector<Allocation>> ReleaseAllExcept(
      const std::set<Owner>& live) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct ForeignRecord {
    std::string path;
    Allocation allocation;
  };

  Ipam(IpPrefix cidr, std::string dir, int lock_fd);
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LoadForeign(const std::string& ipam_root) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<uint64_t> OffsetOf(const IpAddress& addr) const;
  IpAddress AddressAt(uint64_t offset) const;
  bool Reserved(uint64_t offset) const;
  std::string PathFor(const IpAddress& addr) const;
  absl::Status PersistCursor(uint64_t offset) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FreeOffset(uint64_t offset) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the reservation file of `offset` for `owner` (replacing whatever is there).
  absl::Status PersistOffset(uint64_t offset, const Owner& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const IpPrefix cidr_;
  const std::string dir_;  // <state_dir>/ipam/<cidr>
  const int lock_fd_;
  IpAddress gateway_;
  uint64_t size_ = 0;      // addresses in the CIDR, including network and broadcast
  uint64_t capacity_ = 0;  // allocatable ones

  mutable absl::Mutex mu_;
  // Offsets from the network address. An owner may appear twice only after a damaged state
  // directory; by_owner_ then points at the lowest address and GC frees the others.
  std::map<uint64_t, Owner> by_offset_ ABSL_GUARDED_BY(mu_);
  std::map<Owner, uint64_t> by_owner_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> unreadable_ ABSL_GUARDED_BY(mu_);
  std::vector<ForeignRecord> foreign_ ABSL_GUARDED_BY(mu_);
  uint64_t cursor_ ABSL_GUARDED_BY(mu_) = 0;  // last handed-out offset; 0 = none yet
  // Offsets whose file an Allocate is writing (without mu_): taken for every other allocation.
  std::set<uint64_t> pending_ ABSL_GUARDED_BY(mu_);
  bool cursor_writing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice::agent
