#include "agent/base/net.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice::agent {


IpAddress IpAddress::V4(uint32_t host_order) {
  IpAddress a;
  a.family_ = IpFamily::kV4;
  uint32_t be = htonl(host_order);
  std::memcpy(a.bytes_.data(), &be, 4);
  return a;
}

absl::StatusOr<IpAddress> IpAddress::Parse(absl::string_view text) {
  std::string s(text);
  IpAddress a;
  if (inet_pton(AF_INET, s.c_str(), a.bytes_.data()) == 1) {
    a.family_ = IpFamily::kV4;
    return a;
  }
  if (inet_pton(AF_INET6, s.c_str(), a.bytes_.data()) == 1) {
    a.family_ = IpFamily::kV6;
    return a;
  }
  return absl::InvalidArgumentError(absl::StrCat("not an IP address: \"", text, "\""));
}

uint32_t IpAddress::v4_host_order() const {
  uint32_t be;
  std::memcpy(&be, bytes_.data(), 4);
  return ntohl(be);
}

std::string IpAddress::ToString() const {
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(is_v4() ? AF_INET : AF_INET6, bytes_.data(), buf, sizeof(buf));
  return buf;
}

absl::StatusOr<IpPrefix> IpPrefix::Make(IpAddress network, int length) {
  if (length < 0 || length > network.bit_length()) {
    return absl::InvalidArgumentError(absl::StrCat("prefix length ", length, " out of range for ",
                                                   network.ToString()));
  }
  const auto& b = network.bytes();
  const int total = network.bit_length() / 8;
  for (int i = 0; i < total; ++i) {
    int keep = std::clamp(length - i * 8, 0, 8);
    uint8_t host_mask = static_cast<uint8_t>(0xff >> keep);
    if (keep == 8) host_mask = 0;
    if ((b[i] & host_mask) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(network.ToString(), "/", length,
                                                     " has host bits set"));
    }
  }
  IpPrefix p;
  p.network_ = network;
  p.length_ = length;
  return p;
}

absl::StatusOr<IpPrefix> IpPrefix::Parse(absl::string_view text) {
  std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(text, '/');
  int length = 0;
  if (parts.second.empty() || !absl::SimpleAtoi(parts.second, &length)) {
    return absl::InvalidArgumentError(absl::StrCat("not a CIDR: \"", text, "\""));
  }
  absl::StatusOr<IpAddress> addr = IpAddress::Parse(parts.first);
  if (!addr.ok()) return absl::InvalidArgumentError(absl::StrCat("not a CIDR: \"", text, "\""));
  return Make(*addr, length);
}

bool IpPrefix::Contains(const IpAddress& addr) const {
  if (addr.family() != network_.family()) return false;
  const auto& a = addr.bytes();
  const auto& n = network_.bytes();
  int bits = length_;
  for (int i = 0; bits > 0; ++i, bits -= 8) {
    uint8_t mask = bits >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bits));
    if ((a[i] & mask) != (n[i] & mask)) return false;
  }
  return true;
}

std::string IpPrefix::ToString() const { return absl::StrCat(network_.ToString(), "/", length_); }

absl::StatusOr<MacAddress> MacAddress::Parse(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  MacAddress mac;
  if (parts.size() != mac.bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid MAC address \"", text, "\""));
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    uint32_t v = 0;
    if (parts[i].size() != 2 || !absl::SimpleHexAtoi(parts[i], &v)) {
      return absl::InvalidArgumentError(absl::StrCat("invalid MAC address \"", text, "\""));
    }
    mac.bytes[i] = static_cast<uint8_t>(v);
  }
  return mac;
}

std::string MacAddress::ToString() const {
  return absl::StrFormat("%02x:%02x:%02x:%02x:%02x:%02x", bytes[0], bytes[1], bytes[2], bytes[3],
                         bytes[4], bytes[5]);
}

bool MacAddress::IsZero() const {
  for (uint8_t b : bytes) {
    if (b != 0) return false;
  }
  return true;
}

}  // namespace sluice::agent
