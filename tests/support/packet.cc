#include "support/packet.h"

#include <arpa/inet.h>

#include <cstdio>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sluice::testing {
namespace {

void Put16(Bytes& b, size_t off, uint16_t host) {
  b[off] = host >> 8;
  b[off + 1] = host & 0xff;
}
uint16_t Get16(const Bytes& b, size_t off) { return (b[off] << 8) | b[off + 1]; }
void Put32be(Bytes& b, size_t off, uint32_t be) { std::memcpy(&b[off], &be, 4); }
uint32_t Get32be(const Bytes& b, size_t off) {
  uint32_t v;
  std::memcpy(&v, &b[off], 4);
  return v;
}

uint32_t SumWords(const uint8_t* p, size_t n, uint32_t sum = 0) {
  for (size_t i = 0; i + 1 < n; i += 2) sum += (p[i] << 8) | p[i + 1];
  if (n & 1) sum += p[n - 1] << 8;
  return sum;
}
uint16_t Fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}
uint32_t PseudoSum(uint32_t src_be, uint32_t dst_be, uint8_t proto, size_t len) {
  uint8_t ph[12];
  std::memcpy(ph, &src_be, 4);
  std::memcpy(ph + 4, &dst_be, 4);
  ph[8] = 0;
  ph[9] = proto;
  ph[10] = len >> 8;
  ph[11] = len & 0xff;
  return SumWords(ph, 12);
}

}  // namespace

Mac ParseMac(const std::string& s) {
  Mac m{};
  unsigned v[6];
  if (std::sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) ==
      6) {
    for (int i = 0; i < 6; ++i) m[i] = v[i];
  }
  return m;
}
std::string FormatMac(const Mac& m) {
  return absl::StrFormat("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
}
uint32_t Ip4(const std::string& dotted) {
  in_addr a{};
  inet_pton(AF_INET, dotted.c_str(), &a);
  return a.s_addr;
}
std::string FormatIp4(uint32_t be) {
  char buf[INET_ADDRSTRLEN];
  in_addr a{be};
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

Packet Packet::Eth(const Mac& src, const Mac& dst, uint16_t ethertype) {
  Packet p;
  p.src_ = src;
  p.dst_ = dst;
  p.ethertype_ = ethertype;
  return p;
}
Packet& Packet::IPv4(const std::string& src, const std::string& dst, uint8_t ttl) {
  l3_ = L3::kIPv4;
  ethertype_ = 0x0800;
  ip_src_ = Ip4(src);
  ip_dst_ = Ip4(dst);
  ttl_ = ttl;
  return *this;
}
Packet& Packet::Fragment(uint16_t frag) {
  frag_ = frag;
  return *this;
}
Packet& Packet::Protocol(uint8_t proto) {
  l4_ = L4::kRaw;
  proto_ = proto;
  return *this;
}
Packet& Packet::TCP(uint16_t sport, uint16_t dport, uint8_t flags) {
  l4_ = L4::kTcp;
  proto_ = 6;
  sport_ = sport;
  dport_ = dport;
  tcp_flags_ = flags;
  return *this;
}
Packet& Packet::UDP(uint16_t sport, uint16_t dport, bool zero_checksum) {
  l4_ = L4::kUdp;
  proto_ = 17;
  sport_ = sport;
  dport_ = dport;
  udp_zero_ = zero_checksum;
  return *this;
}
Packet& Packet::IcmpEcho(uint16_t id, uint16_t seq, bool reply) {
  return Icmp(reply ? 0 : 8, 0, (uint32_t{id} << 16) | seq);
}
Packet& Packet::Icmp(uint8_t type, uint8_t code, uint32_t rest) {
  l4_ = L4::kIcmp;
  proto_ = 1;
  icmp_type_ = type;
  icmp_code_ = code;
  icmp_rest_ = rest;
  return *this;
}
Packet& Packet::Arp(uint16_t op, const Mac& sha, const std::string& sip, const Mac& tha,
                    const std::string& tip) {
  l3_ = L3::kArp;
  ethertype_ = 0x0806;
  arp_op_ = op;
  arp_sha_ = sha;
  arp_tha_ = tha;
  arp_sip_ = Ip4(sip);
  arp_tip_ = Ip4(tip);
  return *this;
}
Packet& Packet::Payload(const std::string& data) {
  payload_ = data;
  return *this;
}
Packet& Packet::Payload(const Bytes& data) {
  payload_.assign(data.begin(), data.end());
  return *this;
}
Packet& Packet::Id(uint16_t ip_id) {
  ip_id_ = ip_id;
  return *this;
}
Packet& Packet::Seq(uint32_t seq) {
  tcp_seq_ = seq;
  return *this;
}
Packet& Packet::AckSeq(uint32_t ack_seq) {
  tcp_ack_ = ack_seq;
  return *this;
}
Packet& Packet::Window(uint16_t window) {
  tcp_window_ = window;
  return *this;
}
Packet& Packet::Ether(uint16_t ethertype) {
  ethertype_ = ethertype;
  return *this;
}

Bytes Packet::Build() const {
  Bytes b(14, 0);
  std::memcpy(&b[0], dst_.data(), 6);
  std::memcpy(&b[6], src_.data(), 6);
  Put16(b, 12, ethertype_);
  if (l3_ == L3::kArp) {
    Bytes a(28, 0);
    Put16(a, 0, 1);
    Put16(a, 2, 0x0800);
    a[4] = 6;
    a[5] = 4;
    Put16(a, 6, arp_op_);
    std::memcpy(&a[8], arp_sha_.data(), 6);
    Put32be(a, 14, arp_sip_);
    std::memcpy(&a[18], arp_tha_.data(), 6);
    Put32be(a, 24, arp_tip_);
    b.insert(b.end(), a.begin(), a.end());
    return b;
  }
  if (l3_ != L3::kIPv4) {
    b.insert(b.end(), payload_.begin(), payload_.end());
    return b;
  }
  Bytes l4;
  switch (l4_) {
    case L4::kTcp:
      l4.assign(20, 0);
      Put16(l4, 0, sport_);
      Put16(l4, 2, dport_);
      Put32be(l4, 4, htonl(tcp_seq_));
      Put32be(l4, 8, htonl(tcp_ack_));
      l4[12] = 5 << 4;
      l4[13] = tcp_flags_;
      Put16(l4, 14, tcp_window_);
      break;
    case L4::kUdp:
      l4.assign(8, 0);
      Put16(l4, 0, sport_);
      Put16(l4, 2, dport_);
      break;
    case L4::kIcmp:
      l4.assign(8, 0);
      l4[0] = icmp_type_;
      l4[1] = icmp_code_;
      Put32be(l4, 4, htonl(icmp_rest_));
      break;
    default:
      break;
  }
  l4.insert(l4.end(), payload_.begin(), payload_.end());
  if (l4_ == L4::kUdp) Put16(l4, 4, l4.size());
  if (l4_ == L4::kTcp || (l4_ == L4::kUdp && !udp_zero_)) {
    uint16_t c = Fold(SumWords(l4.data(), l4.size(), PseudoSum(ip_src_, ip_dst_, proto_,
                                                                l4.size())));
    if (l4_ == L4::kUdp && c == 0) c = 0xffff;
    Put16(l4, l4_ == L4::kTcp ? 16 : 6, c);
  } else if (l4_ == L4::kIcmp) {
    Put16(l4, 2, Fold(SumWords(l4.data(), l4.size())));
  }
  Bytes ip(20, 0);
  ip[0] = 0x45;
  Put16(ip, 2, 20 + l4.size());
  Put16(ip, 4, ip_id_);
  Put16(ip, 6, frag_);
  ip[8] = ttl_;
  ip[9] = proto_;
  Put32be(ip, 12, ip_src_);
  Put32be(ip, 16, ip_dst_);
  Put16(ip, 10, Fold(SumWords(ip.data(), 20)));
  b.insert(b.end(), ip.begin(), ip.end());
  b.insert(b.end(), l4.begin(), l4.end());
  return b;
}

std::optional<Decoded> Decode(const Bytes& b) {
  if (b.size() < 14) return std::nullopt;
  Decoded d;
  std::memcpy(d.eth_dst.data(), &b[0], 6);
  std::memcpy(d.eth_src.data(), &b[6], 6);
  d.ethertype = Get16(b, 12);
  if (d.ethertype == 0x0806) {
    if (b.size() < 42) return std::nullopt;
    d.arp_op = Get16(b, 20);
    std::memcpy(d.arp_sha.data(), &b[22], 6);
    d.arp_sip = Get32be(b, 28);
    std::memcpy(d.arp_tha.data(), &b[32], 6);
    d.arp_tip = Get32be(b, 38);
    return d;
  }
  if (d.ethertype != 0x0800) return d;
  if (b.size() < 34) return std::nullopt;
  size_t ihl = (b[14] & 0xf) * 4;
  size_t total = Get16(b, 16);
  if (b.size() < 14 + total || total < ihl) return std::nullopt;
  d.ttl = b[22];
  d.proto = b[23];
  d.ip_src = Get32be(b, 26);
  d.ip_dst = Get32be(b, 30);
  d.ip_csum_ok = Fold(SumWords(&b[14], ihl)) == 0;
  const uint8_t* l4 = &b[14 + ihl];
  size_t l4_len = total - ihl;
  size_t hdr = 0;
  if ((Get16(b, 20) & 0x1fff) != 0) {
    d.later_fragment = true;
    d.payload.assign(reinterpret_cast<const char*>(l4), l4_len);
    return d;
  }
  if (d.proto == 6 && l4_len >= 20) {
    hdr = (l4[12] >> 4) * 4;
    d.l4_csum = (l4[16] << 8) | l4[17];
    d.tcp_flags = l4[13];
    d.tcp_seq = (uint32_t{l4[4]} << 24) | (l4[5] << 16) | (l4[6] << 8) | l4[7];
    d.tcp_ack = (uint32_t{l4[8]} << 24) | (l4[9] << 16) | (l4[10] << 8) | l4[11];
    d.l4_csum_ok = Fold(SumWords(l4, l4_len, PseudoSum(d.ip_src, d.ip_dst, 6, l4_len))) == 0;
  } else if (d.proto == 17 && l4_len >= 8) {
    hdr = 8;
    d.l4_csum = (l4[6] << 8) | l4[7];
    d.l4_csum_ok = d.l4_csum == 0 ||
                   Fold(SumWords(l4, l4_len, PseudoSum(d.ip_src, d.ip_dst, 17, l4_len))) == 0;
  } else if (d.proto == 132 && l4_len >= 12) {
    // SCTP: ports, verification tag, CRC32c. The datapath never rewrites SCTP, so its CRC is
    // not recomputed here; a rewrite would show as a byte difference.
    hdr = 12;
    d.l4_csum_ok = true;
  } else if (d.proto == 1 && l4_len >= 8) {
    hdr = 8;
    d.l4_csum = (l4[2] << 8) | l4[3];
    d.l4_csum_ok = Fold(SumWords(l4, l4_len)) == 0;
    d.icmp_type = l4[0];
    d.icmp_code = l4[1];
    d.sport = (l4[4] << 8) | l4[5];
    d.payload.assign(reinterpret_cast<const char*>(l4 + hdr), l4_len - hdr);
    return d;
  }
  if (hdr) {
    d.sport = (l4[0] << 8) | l4[1];
    d.dport = (l4[2] << 8) | l4[3];
    d.payload.assign(reinterpret_cast<const char*>(l4 + hdr), l4_len - hdr);
  }
  return d;
}

std::string Describe(const Bytes& b) {
  auto d = Decode(b);
  if (!d) return absl::StrCat("undecodable ", b.size(), " bytes");
  std::string s = absl::StrCat("eth ", FormatMac(d->eth_src), "->", FormatMac(d->eth_dst));
  if (d->ethertype == 0x0806) {
    return absl::StrCat(s, " | arp op ", d->arp_op, " ", FormatMac(d->arp_sha), "/",
                        FormatIp4(d->arp_sip), " -> ", FormatMac(d->arp_tha), "/",
                        FormatIp4(d->arp_tip));
  }
  if (d->ethertype != 0x0800) return absl::StrFormat("%s | ethertype 0x%04x", s, d->ethertype);
  absl::StrAppend(&s, " | ipv4 ", FormatIp4(d->ip_src), "->", FormatIp4(d->ip_dst), " ttl ",
                  d->ttl, " proto ", d->proto, d->ip_csum_ok ? " csum ok" : " CSUM BAD");
  absl::StrAppend(&s, " | l4 ", d->sport, "->", d->dport, d->l4_csum_ok ? " csum ok" : " CSUM BAD",
                  " | ", d->payload.size(), " payload bytes");
  return s;
}

namespace {

// One header field as Layers() prints it and PacketDiff() compares it.
struct Field {
  std::string layer, name, value;
};

std::string TcpFlagNames(uint8_t f) {
  static constexpr const char* kNames[] = {"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"};
  std::string s;
  for (int i = 0; i < 8; ++i) {
    if (f & (1 << i)) absl::StrAppend(&s, s.empty() ? "" : "|", kNames[i]);
  }
  return s.empty() ? "none" : s;
}

std::string Printable(const uint8_t* p, size_t n) {
  std::string s = "\"";
  for (size_t i = 0; i < n && i < 48; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\') {
      s += static_cast<char>(p[i]);
    } else {
      absl::StrAppendFormat(&s, "\\x%02x", p[i]);
    }
  }
  return absl::StrCat(s, n > 48 ? "\"..." : "\"");
}

std::string Csum(uint16_t value, bool ok) {
  return absl::StrFormat("0x%04x %s", value, ok ? "ok" : "BAD");
}

// Reads `b` field by field; stops (with a "truncated" field) where a header does not fit.
std::vector<Field> Fields(const Bytes& b) {
  std::vector<Field> f;
  auto add = [&f](const char* layer, const char* name, std::string value) {
    f.push_back({layer, name, std::move(value)});
  };
  auto rest = [&](size_t off) {
    if (off < b.size()) {
      add("data", "bytes", absl::StrCat(b.size() - off, " ", Printable(&b[off], b.size() - off)));
    }
  };
  if (b.size() < 14) {
    add("eth", "truncated", absl::StrCat(b.size(), " bytes"));
    return f;
  }
  Mac dst, src;
  std::memcpy(dst.data(), &b[0], 6);
  std::memcpy(src.data(), &b[6], 6);
  uint16_t type = Get16(b, 12);
  add("eth", "dst", FormatMac(dst));
  add("eth", "src", FormatMac(src));
  add("eth", "type", absl::StrFormat("0x%04x", type));
  if (type == 0x0806) {
    if (b.size() < 42) {
      add("arp", "truncated", absl::StrCat(b.size() - 14, " bytes"));
      return f;
    }
    Mac sha, tha;
    std::memcpy(sha.data(), &b[22], 6);
    std::memcpy(tha.data(), &b[32], 6);
    add("arp", "htype", absl::StrCat(Get16(b, 14)));
    add("arp", "ptype", absl::StrFormat("0x%04x", Get16(b, 16)));
    add("arp", "hlen", absl::StrCat(b[18]));
    add("arp", "plen", absl::StrCat(b[19]));
    add("arp", "op", absl::StrCat(Get16(b, 20)));
    add("arp", "sha", FormatMac(sha));
    add("arp", "sip", FormatIp4(Get32be(b, 28)));
    add("arp", "tha", FormatMac(tha));
    add("arp", "tip", FormatIp4(Get32be(b, 38)));
    rest(42);
    return f;
  }
  if (type != 0x0800 || b.size() < 34) {
    rest(14);
    return f;
  }
  size_t ihl = (b[14] & 0xf) * 4;
  size_t total = Get16(b, 16);
  uint32_t saddr = Get32be(b, 26), daddr = Get32be(b, 30);
  add("ipv4", "version", absl::StrCat(b[14] >> 4));
  add("ipv4", "ihl", absl::StrCat(b[14] & 0xf));
  add("ipv4", "tos", absl::StrCat(b[15]));
  add("ipv4", "len", absl::StrCat(total));
  add("ipv4", "id", absl::StrFormat("0x%04x", Get16(b, 18)));
  add("ipv4", "frag", absl::StrFormat("0x%04x", Get16(b, 20)));
  add("ipv4", "ttl", absl::StrCat(b[22]));
  add("ipv4", "proto", absl::StrCat(b[23]));
  add("ipv4", "csum",
      Csum(Get16(b, 24), ihl >= 20 && b.size() >= 14 + ihl && Fold(SumWords(&b[14], ihl)) == 0));
  add("ipv4", "src", FormatIp4(saddr));
  add("ipv4", "dst", FormatIp4(daddr));
  if (ihl < 20 || total < ihl || b.size() < 14 + total) {
    add("ipv4", "bad_length", absl::StrCat("ihl ", ihl, " len ", total, " frame ", b.size()));
    rest(34);
    return f;
  }
  size_t off = 14 + ihl;
  const uint8_t* l4 = &b[off];
  size_t l4_len = total - ihl;
  bool first_fragment = (Get16(b, 20) & 0x1fff) == 0;
  uint8_t proto = b[23];
  if (first_fragment && proto == 6 && l4_len >= 20) {
    bool ok = Fold(SumWords(l4, l4_len, PseudoSum(saddr, daddr, 6, l4_len))) == 0;
    add("tcp", "sport", absl::StrCat(Get16(b, off)));
    add("tcp", "dport", absl::StrCat(Get16(b, off + 2)));
    add("tcp", "seq", absl::StrCat(ntohl(Get32be(b, off + 4))));
    add("tcp", "ack", absl::StrCat(ntohl(Get32be(b, off + 8))));
    add("tcp", "doff", absl::StrCat(l4[12] >> 4));
    add("tcp", "flags", TcpFlagNames(l4[13]));
    add("tcp", "win", absl::StrCat(Get16(b, off + 14)));
    add("tcp", "csum", Csum(Get16(b, off + 16), ok));
    add("tcp", "urg", absl::StrCat(Get16(b, off + 18)));
    off += std::max<size_t>(20, (l4[12] >> 4) * 4);
  } else if (first_fragment && proto == 17 && l4_len >= 8) {
    uint16_t c = Get16(b, off + 6);
    bool ok = Fold(SumWords(l4, l4_len, PseudoSum(saddr, daddr, 17, l4_len))) == 0;
    add("udp", "sport", absl::StrCat(Get16(b, off)));
    add("udp", "dport", absl::StrCat(Get16(b, off + 2)));
    add("udp", "len", absl::StrCat(Get16(b, off + 4)));
    add("udp", "csum", c == 0 ? std::string("0x0000 none") : Csum(c, ok));
    off += 8;
  } else if (first_fragment && proto == 1 && l4_len >= 8) {
    add("icmp", "type", absl::StrCat(l4[0]));
    add("icmp", "code", absl::StrCat(l4[1]));
    add("icmp", "csum", Csum(Get16(b, off + 2), Fold(SumWords(l4, l4_len)) == 0));
    add("icmp", "rest", absl::StrFormat("0x%08x", ntohl(Get32be(b, off + 4))));
    off += 8;
  }
  if (off < 14 + total) {
    add("data", "bytes", absl::StrCat(14 + total - off, " ", Printable(&b[off], 14 + total - off)));
  }
  if (b.size() > 14 + total) {
    add("trailer", "bytes",
        absl::StrCat(b.size() - 14 - total, " ",
                     Printable(&b[14 + total], b.size() - 14 - total)));
  }
  return f;
}

}  // namespace

std::string Layers(const Bytes& b) {
  std::string s;
  std::string layer;
  for (const auto& f : Fields(b)) {
    if (f.layer != layer) {
      absl::StrAppend(&s, s.empty() ? "" : "\n", "  ", absl::StrFormat("%-5s", f.layer));
      layer = f.layer;
    }
    absl::StrAppend(&s, " ", f.name, " ", f.value, " ");
  }
  return s;
}

std::string PacketDiff(const Bytes& expected, const Bytes& actual) {
  if (expected == actual) return "";
  std::vector<Field> e = Fields(expected), a = Fields(actual);
  std::string s;
  for (size_t i = 0; i < std::max(e.size(), a.size()); ++i) {
    const Field* fe = i < e.size() ? &e[i] : nullptr;
    const Field* fa = i < a.size() ? &a[i] : nullptr;
    if (fe && fa && fe->layer == fa->layer && fe->name == fa->name) {
      if (fe->value != fa->value) {
        absl::StrAppend(&s, "  ", fe->layer, ".", fe->name, ": expected ", fe->value,
                        ", actual ", fa->value, "\n");
      }
      continue;
    }
    if (fe) absl::StrAppend(&s, "  ", fe->layer, ".", fe->name, ": expected ", fe->value, ", actual has no such field\n");
    if (fa) absl::StrAppend(&s, "  ", fa->layer, ".", fa->name, ": not expected, actual ", fa->value, "\n");
  }
  std::string offsets;
  int listed = 0;
  for (size_t i = 0; i < std::max(expected.size(), actual.size()) && listed < 16; ++i) {
    bool same = i < expected.size() && i < actual.size() && expected[i] == actual[i];
    if (!same) {
      absl::StrAppend(&offsets, listed++ ? " " : "", i);
    }
  }
  absl::StrAppend(&s, "  bytes: expected ", expected.size(), ", actual ", actual.size(),
                  "; first differing offsets: ", offsets);
  return s;
}

}  // namespace sluice::testing
