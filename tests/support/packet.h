// Declarative packets for BPF fixtures: Eth().IPv4(src, dst).TCP(sport, dport) builds the bytes
// (lengths and checksums filled in); Decode() reads output back, Layers() prints every header
// field layer by layer and PacketDiff() names the fields in which two packets differ.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sluice::testing {

using Mac = std::array<uint8_t, 6>;
using Bytes = std::vector<uint8_t>;

Mac ParseMac(const std::string& s);
std::string FormatMac(const Mac& m);
uint32_t Ip4(const std::string& dotted);  // network byte order
std::string FormatIp4(uint32_t be);

inline constexpr uint8_t kTcpSyn = 0x02;
inline constexpr uint8_t kTcpAck = 0x10;

class Packet {
 public:
  static Packet Eth(const Mac& src, const Mac& dst, uint16_t ethertype = 0);
  Packet& IPv4(const std::string& src, const std::string& dst, uint8_t ttl = 64);
  Packet& Fragment(uint16_t frag_off_field);  // raw frag_off (flags | offset), host order
  Packet& Protocol(uint8_t proto);            // an L4 this builder has no layer for
  Packet& TCP(uint16_t sport, uint16_t dport, uint8_t flags = kTcpSyn);
  Packet& UDP(uint16_t sport, uint16_t dport, bool zero_checksum = false);
  Packet& IcmpEcho(uint16_t id, uint16_t seq, bool reply = false);
  // Any ICMP message; `rest` is the header's second word (0 for errors), host order.
  Packet& Icmp(uint8_t type, uint8_t code, uint32_t rest = 0);
  Packet& Arp(uint16_t op, const Mac& sha, const std::string& sip, const Mac& tha,
              const std::string& tip);
  Packet& Payload(const std::string& data);
  Packet& Payload(const Bytes& data);
  // Header fields the builder otherwise fixes: IPv4 id 0x1234, TCP seq 1000, ack 0, window 65535.
  Packet& Id(uint16_t ip_id);
  Packet& Seq(uint32_t seq);
  Packet& AckSeq(uint32_t ack_seq);
  Packet& Window(uint16_t window);
  Packet& Ether(uint16_t ethertype);  // raw ethertype with no L3 (e.g. IPv6)
  Bytes Build() const;

 private:
  Mac src_{}, dst_{};
  uint16_t ethertype_ = 0;
  enum class L3 { kNone, kIPv4, kArp } l3_ = L3::kNone;
  enum class L4 { kNone, kTcp, kUdp, kIcmp, kRaw } l4_ = L4::kNone;
  uint32_t ip_src_ = 0, ip_dst_ = 0;
  uint8_t ttl_ = 64, proto_ = 0;
  uint16_t frag_ = 0x4000;  // DF
  uint16_t ip_id_ = 0x1234;
  uint16_t sport_ = 0, dport_ = 0;
  uint8_t tcp_flags_ = 0;
  uint32_t tcp_seq_ = 1000, tcp_ack_ = 0;
  uint16_t tcp_window_ = 65535;
  bool udp_zero_ = false;
  uint8_t icmp_type_ = 0, icmp_code_ = 0;
  uint32_t icmp_rest_ = 0;
  uint16_t arp_op_ = 0;
  Mac arp_sha_{}, arp_tha_{};
  uint32_t arp_sip_ = 0, arp_tip_ = 0;
  std::string payload_;
};

// One packet read back, with every checksum recomputed independently.
struct Decoded {
  Mac eth_src{}, eth_dst{};
  uint16_t ethertype = 0;
  // IPv4
  uint32_t ip_src = 0, ip_dst = 0;
  uint8_t ttl = 0, proto = 0;
  bool ip_csum_ok = false;
  bool later_fragment = false;  // a fragment at an offset: no L4 header, all of it is payload
  // L4
  uint16_t sport = 0, dport = 0;  // TCP/UDP ports, ICMP: id in sport
  uint16_t l4_csum = 0;
  bool l4_csum_ok = false;
  uint8_t tcp_flags = 0;
  uint32_t tcp_seq = 0, tcp_ack = 0;  // host order
  uint8_t icmp_type = 0, icmp_code = 0;
  std::string payload;
  // ARP
  uint16_t arp_op = 0;
  Mac arp_sha{}, arp_tha{};
  uint32_t arp_sip = 0, arp_tip = 0;
};

std::optional<Decoded> Decode(const Bytes& b);
// "eth a->b | ipv4 1.2.3.4->5.6.7.8 ttl 63 csum ok | tcp 1000->80 csum ok | 5 bytes"
std::string Describe(const Bytes& b);

// Every header field, one line per layer:
//   eth   dst 02:..  src 02:..  type 0x0800
//   ipv4  ihl 5  tos 0  len 45  id 0x1234  frag 0x4000  ttl 63  proto 6  csum 0x1a2b ok  ...
//   tcp   sport 40000  dport 80  seq 1000  ack 0  flags SYN  win 65535  csum 0x3c4d ok
//   data  5 bytes "GET /"
std::string Layers(const Bytes& b);

// Empty when `expected` and `actual` are the same bytes; otherwise each field that differs
// ("ipv4.ttl: expected 63, actual 64") and the offsets of the differing bytes.
std::string PacketDiff(const Bytes& expected, const Bytes& actual);

}  // namespace sluice::testing
