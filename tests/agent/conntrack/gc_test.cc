// The conntrack GC's timeouts per protocol and state (the datapath records the state).
#include "agent/conntrack/gc.h"

#include <netinet/in.h>

#include "gtest/gtest.h"

namespace sluice::conntrack {
namespace {

TEST(ConntrackTimeouts, TcpStateDecidesTheTimeout) {
  Timeouts t;
  EXPECT_EQ(TimeoutOf(IPPROTO_TCP, 0, t), absl::Seconds(60)) << "SYN only";
  EXPECT_EQ(TimeoutOf(IPPROTO_TCP, SLUICE_CT_F_ESTABLISHED, t), absl::Hours(6));
  EXPECT_EQ(TimeoutOf(IPPROTO_TCP, SLUICE_CT_F_ESTABLISHED | SLUICE_CT_F_CLOSING, t),
            absl::Seconds(30));
  EXPECT_EQ(TimeoutOf(IPPROTO_TCP, SLUICE_CT_F_CLOSING | SLUICE_CT_F_HAIRPIN, t),
            absl::Seconds(30));
}

TEST(ConntrackTimeouts, OtherProtocolsHaveTheirOwnAndIgnoreTcpState) {
  Timeouts t;
  t.udp = absl::Seconds(5);
  t.other = absl::Seconds(7);
  EXPECT_EQ(TimeoutOf(IPPROTO_UDP, 0, t), absl::Seconds(5));
  EXPECT_EQ(TimeoutOf(IPPROTO_UDP, SLUICE_CT_F_ESTABLISHED | SLUICE_CT_F_CLOSING, t),
            absl::Seconds(5));
  EXPECT_EQ(TimeoutOf(IPPROTO_SCTP, 0, t), absl::Seconds(7));
  EXPECT_EQ(TimeoutOf(IPPROTO_ICMP, 0, t), absl::Seconds(7));
}

}  // namespace
}  // namespace sluice::conntrack
