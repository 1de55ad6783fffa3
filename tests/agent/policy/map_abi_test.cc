// The policy map keys as the datapath compares them: LPM tries read the key data big-endian, bit
// by bit, so the byte layout is the contract.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "gtest/gtest.h"
#include "maps/policy.h"

namespace sluice::maps {
namespace {

std::vector<uint8_t> Bytes(const sluice_policy4_key& k) {
  std::vector<uint8_t> out(sizeof(k));
  std::memcpy(out.data(), &k, sizeof(k));
  return out;
}

TEST(PolicyMapAbiTest, KeyDataIsEndpointIdentityDirectionProtoPortInNetworkOrder) {
  sluice_policy4_key k = Policy4LookupKey(0x01020304, 0x00aabbcc, SLUICE_POLICY_EGRESS,
                                          IPPROTO_UDP, 0x1f90);
  EXPECT_EQ(k.prefixlen, 96u);
  // The data after prefixlen (which is host order and not compared bit by bit).
  std::vector<uint8_t> want = {1, 2, 3, 4, 0, 0xaa, 0xbb, 0xcc, SLUICE_POLICY_EGRESS,
                               IPPROTO_UDP, 0x1f, 0x90};
  std::vector<uint8_t> bytes = Bytes(k);
  EXPECT_EQ(std::vector<uint8_t>(bytes.begin() + 4, bytes.end()), want);
}

TEST(PolicyMapAbiTest, PrefixLengthsAndMaskedBits) {
  struct Case {
    int bits;
    uint32_t prefixlen;
    uint8_t proto;
    uint16_t port;  // host order, after masking
  };
  const Case cases[] = {
      {0, 72, 0, 0},          // every protocol: proto and port zeroed
      {8, 80, IPPROTO_TCP, 0},  // every port of TCP
      {8 + 14, 94, IPPROTO_TCP, 80},  // 80..83
      {8 + 16, 96, IPPROTO_TCP, 83},
  };
  for (const Case& c : cases) {
    sluice_policy4_key k = MakePolicy4Key(7, 300, SLUICE_POLICY_INGRESS, IPPROTO_TCP, 83, c.bits);
    EXPECT_EQ(k.prefixlen, c.prefixlen) << c.bits;
    EXPECT_EQ(k.proto, c.proto) << c.bits;
    EXPECT_EQ(ntohs(k.port), c.port) << c.bits;
    EXPECT_EQ(ntohl(k.endpoint_id), 7u);
    EXPECT_EQ(ntohl(k.identity), 300u);
  }
}

}  // namespace
}  // namespace sluice::maps
