// The BIRD configuration the agent renders and the peers it accepts (agent/bgp/bird_config.h);
// speaker_priv_test.cc runs the result in a real BIRD.
#include "agent/bgp/bird_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/bgp/bird_control.h"

namespace sluice::agent::bgp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

IpAddress Ip(const char* text) { return *IpAddress::Parse(text); }
IpPrefix Prefix(const char* text) { return *IpPrefix::Parse(text); }

TEST(ParseBgpPeer, AddressAndAsnWithDefaultTimers) {
  auto peer = ParseBgpPeer("172.30.0.254:65000");
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->address.ToString(), "172.30.0.254");
  EXPECT_EQ(peer->asn, 65000u);
  EXPECT_EQ(peer->hold_time, 9u);
  EXPECT_EQ(peer->keepalive_time, 3u);
}

TEST(ParseBgpPeer, HoldTimeAloneGivesAThirdAsKeepalive) {
  auto peer = ParseBgpPeer("10.0.0.1:4200000000:90");
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->asn, 4200000000u);
  EXPECT_EQ(peer->hold_time, 90u);
  EXPECT_EQ(peer->keepalive_time, 30u);
}

TEST(ParseBgpPeer, RefusesWhatBirdWouldNotTakeOrMisread) {
  for (const char* bad :
       {"", "172.30.0.254", "172.30.0.254:0", "172.30.0.254:x", "fd00::1:65000",
        "172.30.0.254:65000:2", "172.30.0.254:65000:9:9", "172.30.0.254:65000:9:3:1",
        "172.30.0.254:4294967296", "172.30.0.254;:65000"}) {
    auto peer = ParseBgpPeer(bad);
    EXPECT_FALSE(peer.ok()) << "accepted \"" << bad << "\"";
    if (!peer.ok()) EXPECT_THAT(peer.status().message(), HasSubstr("ADDRESS:ASN"));
  }
}

TEST(RenderBirdConfig, AnnouncesThePodCidrsToEveryPeerWithGracefulRestart) {
  BgpOptions options{
      .local_asn = 64512,
      .peers = {*ParseBgpPeer("172.30.0.254:65000"), *ParseBgpPeer("172.30.0.253:65001:30:10")},
      .graceful_restart_time = 120,
      .log_file = "/var/lib/sluice/bgp/bird.log"};
  auto conf = RenderBirdConfig(options, Ip("172.30.0.11"), {Prefix("10.244.1.0/24")});
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_THAT(*conf, HasSubstr("router id 172.30.0.11;"));
  EXPECT_THAT(*conf, HasSubstr("route 10.244.1.0/24 blackhole;"));
  EXPECT_THAT(*conf, HasSubstr("export where proto = \"sluice_pod_cidrs\""));
  // Only what BGP learned goes to the kernel: the pod CIDR's blackhole never does.
  EXPECT_THAT(*conf, HasSubstr("export where source = RTS_BGP;"));
  EXPECT_THAT(*conf, HasSubstr("local as 64512;"));
  EXPECT_THAT(*conf, HasSubstr("graceful restart time 120;"));
  EXPECT_THAT(*conf, HasSubstr("protocol bgp peer_172_30_0_254 from sluice_peer {\n"
                               "  neighbor 172.30.0.254 as 65000;\n  hold time 9;\n"
                               "  keepalive time 3;\n}"));
  EXPECT_THAT(*conf, HasSubstr("neighbor 172.30.0.253 as 65001;\n  hold time 30;\n"
                               "  keepalive time 10;"));
  EXPECT_THAT(*conf, HasSubstr("log \"/var/lib/sluice/bgp/bird.log\""));
  EXPECT_THAT(*conf, Not(HasSubstr("password")));
}

TEST(RenderBirdConfig, PasswordIsQuotedAndOneThatWouldBreakTheFileIsRefused) {
  BgpOptions options{.peers = {*ParseBgpPeer("172.30.0.254:65000")}, .password = "s3cr3t pw"};
  auto conf = RenderBirdConfig(options, Ip("172.30.0.11"), {Prefix("10.244.1.0/24")});
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_THAT(*conf, HasSubstr("password \"s3cr3t pw\";"));
  for (const char* bad : {"a\"; } protocol x {", "back\\slash", "new\nline"}) {
    options.password = bad;
    EXPECT_FALSE(RenderBirdConfig(options, Ip("172.30.0.11"), {}).ok()) << bad;
  }
}

TEST(RenderBirdConfig, APeerGivenTwiceIsRefused) {
  BgpOptions options{
      .peers = {*ParseBgpPeer("172.30.0.254:65000"), *ParseBgpPeer("172.30.0.254:65001")}};
  EXPECT_FALSE(RenderBirdConfig(options, Ip("172.30.0.11"), {}).ok());
}

TEST(ParseBgpSessions, ReadsTheBgpRowsOfShowProtocols) {
  std::vector<std::string> reply = {
      "Name       Proto      Table      State  Since         Info",
      "device1    Device     ---        up     20:26:19.735  ",
      "sluice_kernel Kernel     master4    up     20:26:19.735  ",
      "peer_172_30_0_254 BGP        ---        up     20:26:23.836  Established   ",
      "peer_172_30_0_253 BGP        ---        start  20:26:19.735  Active        Socket: "
      "Connection refused",
      ""};
  auto sessions = ParseBgpSessions(reply);
  ASSERT_EQ(sessions.size(), 2u);
  EXPECT_EQ(sessions[0].name, "peer_172_30_0_254");
  EXPECT_TRUE(sessions[0].established());
  EXPECT_EQ(sessions[1].state, "start");
  EXPECT_EQ(sessions[1].info, "Active Socket: Connection refused");
  EXPECT_FALSE(sessions[1].established());
}

}  // namespace
}  // namespace sluice::agent::bgp
