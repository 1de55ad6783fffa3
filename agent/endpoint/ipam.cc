#include "agent/endpoint/ipam.h"
#include "agent/base/files.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

using nlohmann::json;

constexpr char kCursorFile[] = "last_reserved";
constexpr char kLockFile[] = "lock";

// Regular entries of `dir` (no "." / ".."); directories only if `want_dirs`.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir, bool want_dirs) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, absl::StrCat("list ", dir));
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = readdir(d)) {
    absl::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (want_dirs ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)) names.emplace_back(name);
  }
  int err = errno;
  closedir(d);
  if (err != 0) return ErrnoStatus(err, absl::StrCat("list ", dir));
  return names;
}

json OwnerToJson(const IpamOwner& o) {
  return json{{"network", o.network}, {"containerID", o.container_id}, {"ifName", o.ifname}};
}

absl::StatusOr<IpamOwner> OwnerFromJson(absl::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::DataLossError("not a JSON object");
  auto str = [&](const char* key) -> const std::string* {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
  };
  const std::string* net = str("network");
  const std::string* cid = str("containerID");
  const std::string* ifn = str("ifName");
  if (cid == nullptr || cid->empty() || ifn == nullptr || ifn->empty()) {
    return absl::DataLossError("containerID or ifName missing");
  }
  return IpamOwner{net != nullptr ? *net : "", *cid, *ifn};
}

absl::Status ValidateOwner(const IpamOwner& o) {
  if (o.container_id.empty() || o.ifname.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("IPAM owner needs a container id and an interface name, got ", o.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace


std::string IpamOwner::ToString() const {
  return absl::StrCat(network, "/", container_id, "/", ifname);
}

// ---- Ipam ----------------------------------------------------------------------------------

Ipam::Ipam(IpPrefix cidr, std::string dir, int lock_fd)
    : cidr_(std::move(cidr)), dir_(std::move(dir)), lock_fd_(lock_fd) {
  size_ = uint64_t{1} << (32 - cidr_.length());
  capacity_ = size_ - 3;  // network, gateway, broadcast
  gateway_ = AddressAt(1);
}

Ipam::~Ipam() { close(lock_fd_); }

absl::StatusOr<std::unique_ptr<Ipam>> Ipam::Open(absl::string_view state_dir,
                                                 const IpPrefix& pod_cidr) {
  if (!pod_cidr.network().is_v4()) {
    return absl::UnimplementedError(
        absl::StrCat("IPv6 pod CIDR ", pod_cidr.ToString(), " is not supported yet"));
  }
  if (pod_cidr.length() < 8 || pod_cidr.length() > 30) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pod CIDR ", pod_cidr.ToString(), " must be between /8 and /30 to hold pods"));
  }
  std::string name = pod_cidr.ToString();
  std::replace(name.begin(), name.end(), '/', '_');
  const std::string root = absl::StrCat(state_dir, "/ipam");
  const std::string dir = absl::StrCat(root, "/", name);
  if (absl::Status st = MakeDirs(dir); !st.ok()) return st;

  const std::string lock_path = absl::StrCat(dir, "/", kLockFile);
  int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return ErrnoStatus(errno, absl::StrCat("open IPAM lock ", lock_path));
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    close(lock_fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("IPAM state ", dir, " is in use by another allocator (", lock_path,
                       " is locked)"));
    }
    return ErrnoStatus(err, absl::StrCat("lock ", lock_path));
  }
  std::unique_ptr<Ipam> ipam(new Ipam(pod_cidr, dir, lock_fd));
  if (absl::Status st = ipam->Load(); !st.ok()) return st;
  {
    absl::MutexLock l(&ipam->mu_);
    if (absl::Status st = ipam->LoadForeign(root); !st.ok()) return st;
    spdlog::info("ipam: {} opened: {} of {} addresses in use, {} foreign, {} unreadable, gateway {}",
                 pod_cidr.ToString(), ipam->by_offset_.size(), ipam->capacity_,
                 ipam->foreign_.size(), ipam->unreadable_.size(), ipam->gateway_.ToString());
  }
  return ipam;
}

std::optional<uint64_t> Ipam::OffsetOf(const IpAddress& addr) const {
  if (!cidr_.Contains(addr)) return std::nullopt;
  return addr.v4_host_order() - cidr_.network().v4_host_order();
}

IpAddress Ipam::AddressAt(uint64_t offset) const {
  return IpAddress::V4(cidr_.network().v4_host_order() + static_cast<uint32_t>(offset));
}

bool Ipam::Reserved(uint64_t offset) const { return offset <= 1 || offset >= size_ - 1; }

std::string Ipam::PathFor(const IpAddress& addr) const {
  return absl::StrCat(dir_, "/", addr.ToString());
}

absl::Status Ipam::Load() {
  absl::MutexLock l(&mu_);
  absl::StatusOr<std::vector<std::string>> names = ListDir(dir_, /*want_dirs=*/false);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    if (name == kLockFile) continue;
    if (absl::EndsWith(name, kTmpSuffix)) {  // an interrupted cursor write
      unlink(absl::StrCat(dir_, "/", name).c_str());
      continue;
    }
    if (name == kCursorFile) {
      absl::StatusOr<std::string> text = ReadSmallFile(absl::StrCat(dir_, "/", name));
      absl::StatusOr<IpAddress> addr =
          text.ok() ? IpAddress::Parse(absl::StripAsciiWhitespace(*text)) : text.status();
      std::optional<uint64_t> off = addr.ok() ? OffsetOf(*addr) : std::nullopt;
      if (off.has_value() && !Reserved(*off)) {
        cursor_ = *off;
      } else {
        spdlog::warn("ipam: {}: ignoring unusable cursor {}/{}", cidr_.ToString(), dir_, name);
      }
      continue;
    }
    absl::StatusOr<IpAddress> addr = IpAddress::Parse(name);
    std::optional<uint64_t> off = addr.ok() ? OffsetOf(*addr) : std::nullopt;
    if (!off.has_value() || Reserved(*off)) {
      spdlog::warn("ipam: {}: ignoring {}/{}: not an allocatable address of the CIDR",
                   cidr_.ToString(), dir_, name);
      continue;
    }
    absl::StatusOr<std::string> text = ReadSmallFile(absl::StrCat(dir_, "/", name));
    absl::StatusOr<Owner> owner = text.ok() ? OwnerFromJson(*text) : text.status();
    if (!owner.ok()) {
      spdlog::error("ipam: {}: holding {} with an unreadable record {}/{}: {}", cidr_.ToString(),
                    name, dir_, name, std::string(owner.status().message()));
      unreadable_.insert(*off);
      continue;
    }
    by_offset_.emplace(*off, *std::move(owner));
  }
  for (const auto& [off, owner] : by_offset_) {  // ascending: the lowest address wins
    auto [it, inserted] = by_owner_.emplace(owner, off);
    if (!inserted) {
      spdlog::error("ipam: {}: {} holds both {} and {}; the latter is freed by the next GC",
                    cidr_.ToString(), owner.ToString(), AddressAt(it->second).ToString(),
                    AddressAt(off).ToString());
    }
  }
  return absl::OkStatus();
}

absl::Status Ipam::LoadForeign(const std::string& ipam_root) {
  absl::StatusOr<std::vector<std::string>> dirs = ListDir(ipam_root, /*want_dirs=*/true);
  if (!dirs.ok()) return dirs.status();
  for (const std::string& sub : *dirs) {
    const std::string other = absl::StrCat(ipam_root, "/", sub);
    if (other == dir_) continue;
    absl::StatusOr<std::vector<std::string>> names = ListDir(other, /*want_dirs=*/false);
    if (!names.ok()) return names.status();
    for (const std::string& name : *names) {
      absl::StatusOr<IpAddress> addr = IpAddress::Parse(name);
      if (!addr.ok()) continue;  // lock, cursor, tmp files
      const std::string path = absl::StrCat(other, "/", name);
      absl::StatusOr<std::string> text = ReadSmallFile(path);
      absl::StatusOr<Owner> owner = text.ok() ? OwnerFromJson(*text) : text.status();
      if (!owner.ok()) {
        spdlog::error("ipam: ignoring unreadable record {} of a previous pod CIDR: {}", path,
                      std::string(owner.status().message()));
        continue;
      }
      std::optional<uint64_t> off = OffsetOf(*addr);
      if (off.has_value() && !Reserved(*off) && !by_offset_.contains(*off) &&
          !unreadable_.contains(*off) && !by_owner_.contains(*owner)) {
        // Still valid under the new CIDR: move the record into this CIDR's directory.
        const std::string mine = PathFor(*addr);
        int fd = open(mine.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
          absl::Status st = WriteAllAndSync(fd, *text, absl::StrCat("adopt ", path, " as ", mine));
          close(fd);
          if (st.ok()) st = SyncDir(dir_);
          if (st.ok()) {
            unlink(path.c_str());
            by_offset_.emplace(*off, *owner);
            by_owner_.emplace(*owner, *off);
            spdlog::info("ipam: adopted {} of {} from {}", addr->ToString(), owner->ToString(),
                         other);
            continue;
          }
          unlink(mine.c_str());
          spdlog::error("ipam: {}", st.ToString());
        }
      }
      spdlog::warn("ipam: {} holds {} from a previous pod CIDR ({}), outside {}",
                   owner->ToString(), addr->ToString(), other, cidr_.ToString());
      foreign_.push_back(ForeignRecord{path, Allocation{*addr, *std::move(owner)}});
    }
  }
  return absl::OkStatus();
}

absl::Status Ipam::PersistCursor(uint64_t offset) {
  return WriteFileAtomically(dir_, kCursorFile, AddressAt(offset).ToString());
}

absl::StatusOr<IpAddress> Ipam::Allocate(const Owner& owner) {
  if (absl::Status st = ValidateOwner(owner); !st.ok()) return st;
  // mu_ is held only to read and change the maps, never across the disk: a write that stalls
  // (a slow or hung state filesystem) holds up this ADD alone, never the Lookup, Allocated and
  // Release of other pods (CHECK, STATUS, DEL).
  std::optional<uint64_t> existing;
  {
    absl::MutexLock l(&mu_);
    if (auto it = by_owner_.find(owner); it != by_owner_.end()) existing = it->second;
  }
  if (existing.has_value()) {
    // A reservation whose file was removed behind our back is written again: after a restart
    // the address must still be this owner's.
    const IpAddress addr = AddressAt(*existing);
    struct stat st;
    if (lstat(PathFor(addr).c_str(), &st) != 0 && errno == ENOENT) {
      spdlog::warn("ipam: the reservation file of {} for {} was gone; writing it again",
                   addr.ToString(), owner.ToString());
      if (absl::Status pst = PersistOffset(*existing, owner); !pst.ok()) return pst;
    }
    return addr;
  }

  // Next-fit from the cursor, like host-local: a just-released address is reused last.
  const uint64_t first = 2, last = size_ - 2;
  absl::MutexLock l(&mu_);
  uint64_t candidate = cursor_;
  for (uint64_t tried = 0; tried < capacity_; ++tried) {
    candidate = (candidate < first || candidate >= last) ? first : candidate + 1;
    if (by_offset_.contains(candidate) || unreadable_.contains(candidate) ||
        pending_.contains(candidate)) {
      continue;
    }
    const IpAddress addr = AddressAt(candidate);
    const std::string path = PathFor(addr);
    // Taken while its file is written, so that no other allocation picks it meanwhile.
    pending_.insert(candidate);
    mu_.Unlock();
    absl::Status st;
    bool exists = false;
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      exists = errno == EEXIST;
      st = ErrnoStatus(errno, absl::StrCat("persist allocation ", addr.ToString(), " in ", dir_));
    } else {
      st = WriteAllAndSync(fd, OwnerToJson(owner).dump(),
                           absl::StrCat("persist allocation ", addr.ToString(), " in ", dir_));
      close(fd);
      if (st.ok()) st = SyncDir(dir_);
      if (!st.ok()) unlink(path.c_str());
    }
    mu_.Lock();
    pending_.erase(candidate);
    if (exists) {  // written behind our back: never hand it out
      spdlog::error("ipam: {} appeared on disk without an owner we know; holding it", path);
      unreadable_.insert(candidate);
      continue;
    }
    if (!st.ok()) return st;
    by_offset_.emplace(candidate, owner);
    by_owner_.emplace(owner, candidate);
    cursor_ = candidate;
    // An ADD retried after a pod CIDR change: the old address is no longer routable.
    std::vector<std::string> stale;
    for (auto it = foreign_.begin(); it != foreign_.end();) {
      if (it->allocation.owner == owner) {
        stale.push_back(it->path);
        it = foreign_.erase(it);
      } else {
        ++it;
      }
    }
    // The cursor is a hint (a stale one only makes reuse come sooner): written by one allocation
    // at a time, and skipped while another still writes it.
    const bool write_cursor = !cursor_writing_;
    cursor_writing_ = true;
    mu_.Unlock();
    for (const std::string& path : stale) unlink(path.c_str());
    if (write_cursor) {
      if (absl::Status cst = PersistCursor(candidate); !cst.ok()) {
        spdlog::warn("ipam: {}", cst.ToString());
      }
    }
    mu_.Lock();
    if (write_cursor) cursor_writing_ = false;
    spdlog::debug("ipam: allocated {} to {}", addr.ToString(), owner.ToString());
    return addr;
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "pod CIDR ", cidr_.ToString(), " is exhausted: ", by_offset_.size() + unreadable_.size(),
      " of ", capacity_, " allocatable addresses in use"));
}

absl::Status Ipam::FreeOffset(uint64_t offset) {
  const IpAddress addr = AddressAt(offset);
  const std::string path = PathFor(addr);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("release ", addr.ToString(), " in ", dir_));
  }
  auto it = by_offset_.find(offset);
  if (it != by_offset_.end()) {
    auto o = by_owner_.find(it->second);
    if (o != by_owner_.end() && o->second == offset) by_owner_.erase(o);
    by_offset_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status Ipam::PersistOffset(uint64_t offset, const Owner& owner) {
  const IpAddress addr = AddressAt(offset);
  return WriteFileAtomically(dir_, addr.ToString(), OwnerToJson(owner).dump());
}

absl::Status Ipam::Reserve(const Owner& owner, const IpAddress& address) {
  if (absl::Status st = ValidateOwner(owner); !st.ok()) return st;
  std::optional<uint64_t> off = OffsetOf(address);
  if (!off.has_value() || Reserved(*off)) {
    return absl::InvalidArgumentError(absl::StrCat(address.ToString(), " is not an allocatable "
                                                   "address of ", cidr_.ToString()));
  }
  absl::MutexLock l(&mu_);
  if (auto held = by_offset_.find(*off); held != by_offset_.end()) {
    if (held->second != owner) {
      return absl::FailedPreconditionError(
          absl::StrCat(address.ToString(), " is reserved for ", held->second.ToString(),
                       ", not for ", owner.ToString()));
    }
    struct stat st;
    if (lstat(PathFor(address).c_str(), &st) == 0) return absl::OkStatus();
    spdlog::warn("ipam: the reservation file of {} for {} was gone; writing it again",
                 address.ToString(), owner.ToString());
    return PersistOffset(*off, owner);
  }
  // Free in memory: its file is gone (or unreadable). The live endpoint's claim wins.
  if (absl::Status st = PersistOffset(*off, owner); !st.ok()) return st;
  unreadable_.erase(*off);
  if (auto other = by_owner_.find(owner); other != by_owner_.end()) {
    spdlog::warn("ipam: {} holds {} but its endpoint uses {}; moving the reservation",
                 owner.ToString(), AddressAt(other->second).ToString(), address.ToString());
    const uint64_t old = other->second;
    if (absl::Status st = FreeOffset(old); !st.ok()) return st;
  }
  by_offset_.emplace(*off, owner);
  by_owner_.insert_or_assign(owner, *off);
  spdlog::warn("ipam: reserved {} again for {}: its endpoint is live but the reservation was gone",
               address.ToString(), owner.ToString());
  return absl::OkStatus();
}

absl::Status Ipam::VerifyPersisted(const Owner& owner, const IpAddress& address) const {
  const std::string path = PathFor(address);
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::NotFoundError(absl::StrCat("reservation file ", path,
                                                              " is gone"))
                           : ErrnoStatus(errno, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::DataLossError(absl::StrCat("reservation file ", path, " is not a regular file"));
  }
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  absl::StatusOr<Owner> recorded = text.ok() ? OwnerFromJson(*text) : text.status();
  if (!recorded.ok()) {
    return absl::DataLossError(absl::StrCat("reservation file ", path, " is unreadable: ",
                                            recorded.status().message()));
  }
  if (*recorded != owner) {
    return absl::DataLossError(absl::StrCat("reservation file ", path, " names ",
                                            recorded->ToString()));
  }
  return absl::OkStatus();
}

absl::Status Ipam::Release(const Owner& owner) {
  // The files go first, outside mu_ (see Allocate); the addresses stay taken in memory until
  // they are gone, so that no allocation meets a file still on disk.
  std::vector<uint64_t> offsets;
  std::vector<std::string> foreign_paths;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [off, o] : by_offset_) {
      if (o == owner) offsets.push_back(off);
    }
    for (const ForeignRecord& f : foreign_) {
      if (f.allocation.owner == owner) foreign_paths.push_back(f.path);
    }
  }
  absl::Status first;
  std::vector<uint64_t> freed;
  for (uint64_t off : offsets) {
    const std::string path = PathFor(AddressAt(off));
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      first.Update(ErrnoStatus(errno, absl::StrCat("release ", AddressAt(off).ToString(), " in ",
                                                   dir_)));
      continue;
    }
    freed.push_back(off);
  }
  std::vector<std::string> foreign_freed;
  for (const std::string& path : foreign_paths) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      first.Update(ErrnoStatus(errno, absl::StrCat("release ", path)));
      continue;
    }
    foreign_freed.push_back(path);
  }
  if (!freed.empty()) (void)SyncDir(dir_);
  absl::MutexLock l(&mu_);
  for (uint64_t off : freed) {
    auto it = by_offset_.find(off);
    if (it == by_offset_.end() || it->second != owner) continue;
    auto o = by_owner_.find(owner);
    if (o != by_owner_.end() && o->second == off) by_owner_.erase(o);
    by_offset_.erase(it);
    spdlog::debug("ipam: released {} of {}", AddressAt(off).ToString(), owner.ToString());
  }
  std::erase_if(foreign_, [&](const ForeignRecord& f) {
    return std::find(foreign_freed.begin(), foreign_freed.end(), f.path) != foreign_freed.end();
  });
  return first;
}

std::optional<IpAddress> Ipam::Lookup(const Owner& owner) const {
  absl::MutexLock l(&mu_);
  auto it = by_owner_.find(owner);
  if (it == by_owner_.end()) return std::nullopt;
  return AddressAt(it->second);
}

std::vector<IpamAllocation> Ipam::Allocated() const {
  absl::MutexLock l(&mu_);
  std::vector<Allocation> out;
  out.reserve(by_offset_.size());
  for (const auto& [off, owner] : by_offset_) out.push_back(Allocation{AddressAt(off), owner});
  return out;
}

std::vector<IpamAllocation> Ipam::Foreign() const {
  absl::MutexLock l(&mu_);
  std::vector<Allocation> out;
  for (const ForeignRecord& f : foreign_) out.push_back(f.allocation);
  return out;
}

std::vector<IpAddress> Ipam::Unreadable() const {
  absl::MutexLock l(&mu_);
  std::vector<IpAddress> out;
  for (uint64_t off : unreadable_) out.push_back(AddressAt(off));
  return out;
}

absl::StatusOr<std::vector<IpamAllocation>> Ipam::ReleaseAllExcept(const std::set<Owner>& live) {
  // What to free is decided under mu_, the files go without it (see Allocate), and the memory
  // follows for what is gone from disk.
  std::vector<Allocation> leaked;
  std::vector<ForeignRecord> foreign;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [off, owner] : by_offset_) {
      auto primary = by_owner_.find(owner);
      bool duplicate = primary != by_owner_.end() && primary->second != off;
      if (duplicate || !live.contains(owner)) leaked.push_back(Allocation{AddressAt(off), owner});
    }
    for (const ForeignRecord& f : foreign_) {
      if (!live.contains(f.allocation.owner)) foreign.push_back(f);
    }
  }
  absl::Status first_error;
  std::vector<Allocation> freed;
  std::vector<std::string> foreign_freed;
  for (const Allocation& a : leaked) {
    if (unlink(PathFor(a.address).c_str()) != 0 && errno != ENOENT) {
      first_error.Update(ErrnoStatus(errno, absl::StrCat("release ", a.address.ToString(),
                                                         " in ", dir_)));
      continue;
    }
    spdlog::info("ipam: GC released {} of {}", a.address.ToString(), a.owner.ToString());
    freed.push_back(a);
  }
  const size_t current = freed.size();
  for (const ForeignRecord& f : foreign) {
    if (unlink(f.path.c_str()) != 0 && errno != ENOENT) {
      first_error.Update(ErrnoStatus(errno, absl::StrCat("release ", f.path)));
      continue;
    }
    spdlog::info("ipam: GC released foreign {} of {}", f.allocation.address.ToString(),
                 f.allocation.owner.ToString());
    freed.push_back(f.allocation);
    foreign_freed.push_back(f.path);
  }
  if (!leaked.empty()) (void)SyncDir(dir_);
  {
    absl::MutexLock l(&mu_);
    for (size_t i = 0; i < current; ++i) {
      const uint64_t off = *OffsetOf(freed[i].address);
      auto it = by_offset_.find(off);
      if (it == by_offset_.end() || it->second != freed[i].owner) continue;
      auto o = by_owner_.find(it->second);
      if (o != by_owner_.end() && o->second == off) by_owner_.erase(o);
      by_offset_.erase(it);
    }
    std::erase_if(foreign_, [&](const ForeignRecord& f) {
      return std::find(foreign_freed.begin(), foreign_freed.end(), f.path) != foreign_freed.end();
    });
  }
  if (!first_error.ok()) return first_error;
  return freed;
}

}  // namespace sluice::agent
