// The lab kubelet's reading of a pod's bandwidth annotations into the runtimeConfig "bandwidth" a
// runtime passes to a plugin declaring the capability (as containerd fills it).
#include <gtest/gtest.h>

#include <cstdint>

#include "agent/lab/node/kubelet.h"

namespace sluice::lab {
namespace {

using nlohmann::json;

TEST(ParseBandwidthQuantity, ReadsDecimalAndBinarySuffixesInBitsPerSecond) {
  EXPECT_EQ(*ParseBandwidthQuantity("8M"), 8000000u);
  EXPECT_EQ(*ParseBandwidthQuantity("500k"), 500000u);
  EXPECT_EQ(*ParseBandwidthQuantity("1Gi"), 1073741824u);
  EXPECT_EQ(*ParseBandwidthQuantity("2.5M"), 2500000u);
  EXPECT_EQ(*ParseBandwidthQuantity("1000"), 1000u);
  EXPECT_EQ(*ParseBandwidthQuantity("1P"), 1000000000000000u);
}

TEST(ParseBandwidthQuantity, RefusesWhatTheKubeletRefuses) {
  EXPECT_FALSE(ParseBandwidthQuantity("10").ok()) << "under 1 kbit/s";
  EXPECT_FALSE(ParseBandwidthQuantity("2P").ok()) << "over 1 Pbit/s";
  EXPECT_FALSE(ParseBandwidthQuantity("").ok());
  EXPECT_FALSE(ParseBandwidthQuantity("fast").ok());
  EXPECT_FALSE(ParseBandwidthQuantity("1..5M").ok());
  EXPECT_FALSE(ParseBandwidthQuantity("-8M").ok());
}

TEST(RuntimeBandwidth, EachAnnotationIsARateWithContainerdsUnsetBurst) {
  RunningPod pod;
  EXPECT_TRUE(RuntimeBandwidth(pod)->is_null()) << "no annotation: no runtimeConfig";
  pod.ingress_bandwidth = "8M";
  EXPECT_EQ(*RuntimeBandwidth(pod), (json{{"ingressRate", 8000000}, {"ingressBurst", UINT32_MAX}}));
  pod.egress_bandwidth = "1M";
  EXPECT_EQ(*RuntimeBandwidth(pod), (json{{"ingressRate", 8000000},
                                          {"ingressBurst", UINT32_MAX},
                                          {"egressRate", 1000000},
                                          {"egressBurst", UINT32_MAX}}));
  pod.egress_bandwidth = "1";
  EXPECT_FALSE(RuntimeBandwidth(pod).ok());
}

}  // namespace
}  // namespace sluice::lab
