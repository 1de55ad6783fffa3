#include "agent/endpoint/endpoint_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/base/files.h"
#include "cni/protocol/netconf.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

using nlohmann::json;

constexpr char kJsonSuffix[] = ".json";

// CNI: a container id is "[a-zA-Z0-9][a-zA-Z0-9_.-]*"; an interface name is at most 15 bytes,
// not "." or "..", without '/', ':' or whitespace. Both are then safe inside a file name.
absl::Status ValidateKey(absl::string_view container_id, absl::string_view ifname) {
  bool id_ok = !container_id.empty() && absl::ascii_isalnum(container_id[0]) &&
               std::all_of(container_id.begin(), container_id.end(), [](char c) {
                 return absl::ascii_isalnum(c) || c == '_' || c == '.' || c == '-';
               });
  if (!id_ok) {
    return absl::InvalidArgumentError(absl::StrCat("invalid container id \"", container_id, "\""));
  }
  bool if_ok = !ifname.empty() && ifname.size() <= 15 && ifname != "." && ifname != ".." &&
               std::none_of(ifname.begin(), ifname.end(), [](char c) {
                 return c == '/' || c == ':' || absl::ascii_isspace(c) || c == '\0';
               });
  if (!if_ok) {
    return absl::InvalidArgumentError(absl::StrCat("invalid interface name \"", ifname, "\""));
  }
  return absl::OkStatus();
}

// SHA-256 (FIPS 180-4). Only for naming interfaces: short inputs, no need for speed.
std::array<uint8_t, 32> Sha256(absl::string_view data) {
  static constexpr uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
      0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
      0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
      0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
      0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
      0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
      0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
      0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
      0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  auto rotr = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };

  std::string msg(data);
  const uint64_t bit_len = static_cast<uint64_t>(msg.size()) * 8;
  msg.push_back(static_cast<char>(0x80));
  while (msg.size() % 64 != 56) msg.push_back('\0');
  for (int i = 7; i >= 0; --i) msg.push_back(static_cast<char>(bit_len >> (i * 8)));

  for (size_t chunk = 0; chunk < msg.size(); chunk += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const uint8_t*>(msg.data() + chunk + i * 4);
      w[i] = uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      uint32_t ch = (e & f) ^ (~e & g);
      uint32_t t1 = hh + s1 + ch + k[i] + w[i];
      uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      uint32_t t2 = s0 + maj;
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  }
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) out[i * 4 + j] = static_cast<uint8_t>(h[i] >> (24 - j * 8));
  }
  return out;
}

}  // namespace

// ---- JSON ----------------------------------------------------------------------------------

json EndpointToJson(const Endpoint& ep) {
  json out{
      {"containerID", ep.container_id},
      {"ifName", ep.ifname},
      {"netns", ep.netns},
      {"networkName", ep.network_name},
      {"podNamespace", ep.pod_namespace},
      {"podName", ep.pod_name},
      {"hostIfName", ep.host_ifname},
      {"hostIfIndex", ep.host_ifindex},
      {"ipv4", ep.ipv4},
      {"mac", ep.mac},
      {"hostMac", ep.host_mac},
      {"endpointID", ep.endpoint_id},
      {"mtu", ep.mtu},
      {"created", absl::FormatTime(absl::RFC3339_full, ep.created, absl::UTCTimeZone())},
  };
  // Only a limited pod's record carries "bandwidth" (records of agents before it have none).
  if (ep.ingress.limited() || ep.egress.limited()) {
    json bw = json::object();
    if (ep.ingress.limited()) {
      bw["ingressRate"] = ep.ingress.rate;
      bw["ingressBurstBytes"] = ep.ingress.burst_bytes;
    }
    if (ep.egress.limited()) {
      bw["egressRate"] = ep.egress.rate;
      bw["egressBurstBytes"] = ep.egress.burst_bytes;
    }
    out["bandwidth"] = std::move(bw);
  }
  return out;
}

absl::StatusOr<Endpoint> EndpointFromJson(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("endpoint is not a JSON object");
  std::string missing;
  auto str = [&](const char* key, std::string* out, bool required) {
    auto it = j.find(key);
    if (it != j.end() && it->is_string()) {
      *out = it->get<std::string>();
    } else if (required || it != j.end()) {
      absl::StrAppend(&missing, missing.empty() ? "" : ", ", key);
    }
  };
  auto num = [&](const char* key, auto* out, int64_t min, int64_t max) {
    auto it = j.find(key);
    if (it != j.end() && it->is_number_integer() && it->get<int64_t>() >= min &&
        it->get<int64_t>() <= max) {
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(it->get<int64_t>());
    } else {
      absl::StrAppend(&missing, missing.empty() ? "" : ", ", key);
    }
  };
  Endpoint ep;
  str("containerID", &ep.container_id, true);
  str("ifName", &ep.ifname, true);
  str("netns", &ep.netns, false);
  str("networkName", &ep.network_name, false);
  str("podNamespace", &ep.pod_namespace, false);
  str("podName", &ep.pod_name, false);
  str("hostIfName", &ep.host_ifname, false);
  str("ipv4", &ep.ipv4, false);
  str("mac", &ep.mac, false);
  str("hostMac", &ep.host_mac, false);
  num("hostIfIndex", &ep.host_ifindex, 0, INT32_MAX);
  num("endpointID", &ep.endpoint_id, 0, UINT32_MAX);
  num("mtu", &ep.mtu, 0, INT32_MAX);
  std::string created;
  str("created", &created, true);
  if (auto bw = j.find("bandwidth"); bw != j.end()) {
    auto limit = [&](const char* rate_key, const char* burst_key, BandwidthLimit* out) {
      auto rate = bw->find(rate_key);
      if (rate == bw->end()) return;
      auto burst = bw->find(burst_key);
      if (rate->is_number_unsigned() && rate->get<uint64_t>() > 0 && burst != bw->end() &&
          burst->is_number_unsigned() && burst->get<uint64_t>() > 0 &&
          burst->get<uint64_t>() <= UINT32_MAX) {
        out->rate = rate->get<uint64_t>();
        out->burst_bytes = static_cast<uint32_t>(burst->get<uint64_t>());
      } else {
        absl::StrAppend(&missing, missing.empty() ? "" : ", ", "bandwidth.", rate_key);
      }
    };
    if (!bw->is_object()) {
      absl::StrAppend(&missing, missing.empty() ? "" : ", ", "bandwidth");
    } else {
      limit("ingressRate", "ingressBurstBytes", &ep.ingress);
      limit("egressRate", "egressBurstBytes", &ep.egress);
    }
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("endpoint missing or invalid: ", missing));
  }
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, created, &ep.created, &err)) {
    return absl::InvalidArgumentError(absl::StrCat("endpoint created \"", created, "\": ", err));
  }
  if (absl::Status st = ValidateKey(ep.container_id, ep.ifname); !st.ok()) return st;
  return ep;
}

namespace {

std::string HexDigits(const std::array<uint8_t, 32>& digest, size_t count) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < count; ++i)
    out.push_back(kHex[digest[i / 2] >> (i % 2 == 0 ? 4 : 0) & 0xf]);
  return out;
}

}  // namespace

std::string HostInterfaceName(absl::string_view container_id, absl::string_view ifname) {
  return absl::StrCat(kHostInterfacePrefix,
                      HexDigits(Sha256(absl::StrCat(container_id, "/", ifname)), 11));
}

std::string LegacyHostInterfaceName(absl::string_view container_id, absl::string_view ifname) {
  return absl::StrCat("lxc", HexDigits(Sha256(absl::StrCat(container_id, "/", ifname)), 11));
}

std::string LinkMark(absl::string_view container_id, absl::string_view ifname) {
  std::string mark = absl::StrCat(kSluiceLinkMarkPrefix, container_id, "/", ifname);
  if (mark.size() < 256) return mark;  // IFALIASZ
  return absl::StrCat(kSluiceLinkMarkPrefix,
                      "sha256:", HexDigits(Sha256(absl::StrCat(container_id, "/", ifname)), 64));
}

// ---- EndpointStore -------------------------------------------------------------------------

// The longest record name, written through its temporary file, fits a file name: the plugin and
// the endpoint API refuse longer attachment keys up front (code 4).
static_assert(cni::kMaxAttachmentKeyBytes + (sizeof("-") - 1) + (sizeof(kJsonSuffix) - 1) +
                  (sizeof(kTmpSuffix) - 1) <=
              NAME_MAX);

std::string EndpointStore::FileName(absl::string_view container_id, absl::string_view ifname) {
  return absl::StrCat(container_id, "-", ifname, kJsonSuffix);
}

absl::StatusOr<std::unique_ptr<EndpointStore>> EndpointStore::Open(absl::string_view state_dir) {
  const std::string dir = absl::StrCat(state_dir, "/endpoints");
  if (absl::Status st = MakeDirs(dir); !st.ok()) return st;
  std::unique_ptr<EndpointStore> store(new EndpointStore(dir));
  if (absl::Status st = store->Load(); !st.ok()) return st;
  return store;
}

absl::Status EndpointStore::Load() {
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) return ErrnoStatus(errno, absl::StrCat("list endpoints in ", dir_));
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  int err = errno;
  closedir(d);
  if (err != 0) return ErrnoStatus(err, absl::StrCat("list endpoints in ", dir_));
  std::sort(names.begin(), names.end());

  absl::MutexLock l(&mu_);
  std::vector<Endpoint> need_id;
  for (const std::string& name : names) {
    const std::string path = absl::StrCat(dir_, "/", name);
    if (absl::EndsWith(name, kTmpSuffix)) {  // a write interrupted before its rename
      spdlog::info("endpoints: removing leftover {}", path);
      unlink(path.c_str());
      continue;
    }
    if (!absl::EndsWith(name, kJsonSuffix)) continue;
    absl::StatusOr<std::string> text = ReadSmallFile(path);
    absl::StatusOr<Endpoint> ep = absl::DataLossError("not valid JSON");
    if (!text.ok()) {
      ep = text.status();
    } else if (json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
               !j.is_discarded()) {
      ep = EndpointFromJson(j);
    }
    if (ep.ok() && FileName(ep->container_id, ep->ifname) != name) {
      ep = absl::DataLossError(absl::StrCat("holds endpoint ", ep->container_id, "/", ep->ifname,
                                            ", which belongs in ",
                                            FileName(ep->container_id, ep->ifname)));
    }
    if (!ep.ok()) {
      ++corrupt_files_;
      spdlog::error("endpoints: skipping corrupt {}: {}", path, ep.status().ToString());
      continue;
    }
    if (ep->endpoint_id == 0 || ids_.contains(ep->endpoint_id)) {
      need_id.push_back(*std::move(ep));
      continue;
    }
    Key key(ep->container_id, ep->ifname);
    ids_.insert(ep->endpoint_id);
    files_.emplace(name, key);
    endpoints_.emplace(std::move(key), *std::move(ep));
  }
  // Damaged state (an id used twice, or none): give the newcomer a fresh id rather than forget it.
  for (Endpoint& ep : need_id) {
    uint32_t old = ep.endpoint_id;
    ep.endpoint_id = NextFreeId();
    const std::string name = FileName(ep.container_id, ep.ifname);
    spdlog::error("endpoints: {} had endpoint id {} already in use; reassigned {}", name, old,
                  ep.endpoint_id);
    if (absl::Status st = WriteFileAtomically(dir_, name, EndpointToJson(ep).dump(2)); !st.ok()) {
      return st;
    }
    Key key(ep.container_id, ep.ifname);
    ids_.insert(ep.endpoint_id);
    files_.emplace(name, key);
    endpoints_.emplace(std::move(key), std::move(ep));
  }
  spdlog::info("endpoints: loaded {} from {} ({} corrupt)", endpoints_.size(), dir_,
               corrupt_files_);
  return absl::OkStatus();
}

uint32_t EndpointStore::NextFreeId() const {
  uint32_t want = 1;
  for (uint32_t id : ids_) {  // ascending
    if (id > want) break;
    if (id == want) ++want;
  }
  return want;
}

absl::StatusOr<Endpoint> EndpointStore::Put(Endpoint ep) {
  if (absl::Status st = ValidateKey(ep.container_id, ep.ifname); !st.ok()) return st;
  Key key(ep.container_id, ep.ifname);
  const std::string name = FileName(ep.container_id, ep.ifname);

  // mu_ is held to check and reserve, and to commit, never across the write: a write that
  // stalls holds up this request alone, not the Get and List of every other one.
  uint32_t old_id = 0;
  {
    absl::MutexLock l(&mu_);
    if (auto f = files_.find(name); f != files_.end() && f->second != key) {
      return absl::AlreadyExistsError(absl::StrCat(
          "endpoint ", key.first, "/", key.second, " would share the file ", name, " with ",
          f->second.first, "/", f->second.second));
    }
    if (writing_.contains(name)) {
      return absl::UnavailableError(absl::StrCat("endpoint ", key.first, "/", key.second,
                                                 " is being written by another request"));
    }
    auto existing = endpoints_.find(key);
    old_id = existing != endpoints_.end() ? existing->second.endpoint_id : 0;
    if (ep.endpoint_id == 0) {
      ep.endpoint_id = old_id != 0 ? old_id : NextFreeId();
    } else if (ep.endpoint_id != old_id && ids_.contains(ep.endpoint_id)) {
      return absl::AlreadyExistsError(absl::StrCat("endpoint id ", ep.endpoint_id,
                                                   " belongs to another endpoint"));
    }
    ids_.insert(ep.endpoint_id);  // taken while the file is written
    writing_.insert(name);
  }
  absl::Status written = WriteFileAtomically(dir_, name, EndpointToJson(ep).dump(2));
  absl::MutexLock l(&mu_);
  writing_.erase(name);
  if (!written.ok()) {
    if (ep.endpoint_id != old_id) ids_.erase(ep.endpoint_id);
    return absl::Status(written.code(), absl::StrCat("persist endpoint ", key.first, "/",
                                                     key.second, ": ", written.message()));
  }
  if (old_id != 0 && old_id != ep.endpoint_id) ids_.erase(old_id);
  files_.emplace(name, key);
  endpoints_.insert_or_assign(std::move(key), ep);
  return ep;
}

std::optional<Endpoint> EndpointStore::Get(absl::string_view container_id,
                                           absl::string_view ifname) const {
  absl::MutexLock l(&mu_);
  auto it = endpoints_.find(Key(container_id, ifname));
  if (it == endpoints_.end()) return std::nullopt;
  return it->second;
}

absl::Status EndpointStore::Remove(absl::string_view container_id, absl::string_view ifname) {
  {
    absl::MutexLock l(&mu_);
    if (!endpoints_.contains(Key(container_id, ifname))) return absl::OkStatus();
  }
  // The file goes outside mu_ (see Put); the record stays visible until it is gone.
  const std::string name = FileName(container_id, ifname);
  const std::string path = absl::StrCat(dir_, "/", name);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("remove endpoint ", container_id, "/", ifname, " (",
                                          path, ")"));
  }
  (void)SyncDir(dir_);  // a resurrected file after a crash is only a stale endpoint for GC
  absl::MutexLock l(&mu_);
  auto it = endpoints_.find(Key(container_id, ifname));
  if (it == endpoints_.end()) return absl::OkStatus();
  ids_.erase(it->second.endpoint_id);
  files_.erase(name);
  endpoints_.erase(it);
  return absl::OkStatus();
}

absl::Status EndpointStore::VerifyPersisted(const Endpoint& ep) const {
  const std::string path = absl::StrCat(dir_, "/", FileName(ep.container_id, ep.ifname));
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::NotFoundError(absl::StrCat("record ", path, " is gone"))
                           : ErrnoStatus(errno, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::DataLossError(absl::StrCat("record ", path, " is not a regular file"));
  }
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<Endpoint> recorded =
      j.is_discarded() ? absl::DataLossError("not JSON") : EndpointFromJson(j);
  if (!recorded.ok()) {
    return absl::DataLossError(
        absl::StrCat("record ", path, " is unreadable: ", recorded.status().message()));
  }
  if (recorded->container_id != ep.container_id || recorded->ifname != ep.ifname ||
      recorded->ipv4 != ep.ipv4 || recorded->host_ifname != ep.host_ifname ||
      recorded->host_ifindex != ep.host_ifindex || recorded->endpoint_id != ep.endpoint_id) {
    return absl::DataLossError(absl::StrCat("record ", path, " differs from the agent's: ",
                                            recorded->ipv4, " on ", recorded->host_ifname,
                                            " (endpoint ", recorded->endpoint_id, ")"));
  }
  return absl::OkStatus();
}

std::vector<Endpoint> EndpointStore::List() const {
  absl::MutexLock l(&mu_);
  std::vector<Endpoint> out;
  out.reserve(endpoints_.size());
  for (const auto& [key, ep] : endpoints_) out.push_back(ep);
  return out;
}

size_t EndpointStore::size() const {
  absl::MutexLock l(&mu_);
  return endpoints_.size();
}

}  // namespace sluice::agent
