// The agent's network value types: IPv4/IPv6 addresses, CIDR prefixes and MAC addresses.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::agent {

enum class IpFamily : uint8_t { kV4 = 4, kV6 = 6 };

// An IPv4 or IPv6 address as a value. Bytes are in network order; a v4 address uses bytes[0..3].
class IpAddress {
 public:
  IpAddress() = default;  // 0.0.0.0
  static IpAddress V4(uint32_t host_order);
  [[nodiscard]] static absl::StatusOr<IpAddress> Parse(absl::string_view text);

  IpFamily family() const { return family_; }
  bool is_v4() const { return family_ == IpFamily::kV4; }
  int bit_length() const { return is_v4() ? 32 : 128; }
  // Only for v4 addresses.
  uint32_t v4_host_order() const;
  const std::array<uint8_t, 16>& bytes() const { return bytes_; }
  std::string ToString() const;

  friend auto operator<=>(const IpAddress&, const IpAddress&) = default;

 private:
  IpFamily family_ = IpFamily::kV4;
  std::array<uint8_t, 16> bytes_{};
};

// A CIDR, always in canonical form (host bits of `address` are zero).
class IpPrefix {
 public:
  // Rejects prefixes with host bits set ("10.244.0.5/24"): a pod CIDR is a network.
  [[nodiscard]] static absl::StatusOr<IpPrefix> Parse(absl::string_view text);
  [[nodiscard]] static absl::StatusOr<IpPrefix> Make(IpAddress network, int length);

  const IpAddress& network() const { return network_; }
  int length() const { return length_; }
  bool Contains(const IpAddress& addr) const;
  std::string ToString() const;  // "10.244.0.0/24"

  friend auto operator<=>(const IpPrefix&, const IpPrefix&) = default;

 private:
  IpAddress network_;
  int length_ = 0;
};

struct MacAddress {
  std::array<uint8_t, 6> bytes{};

  [[nodiscard]] static absl::StatusOr<MacAddress> Parse(absl::string_view text);  // aa:bb:...
  std::string ToString() const;                                                   // lowercase
  bool IsZero() const;

  friend bool operator==(const MacAddress&, const MacAddress&) = default;
};

}  // namespace sluice::agent
