#include "cni/protocol/netconf.h"

#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::cni {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

json MinimalConfig(std::string_view version = "1.0.0") {
  return json{{"cniVersion", version}, {"name", "sluice-net"}, {"type", "sluice"}};
}

// The CNI code a parse of `config` fails with (0 if it succeeds).
int ParseCode(const json& config) {
  absl::StatusOr<NetConf> conf = ParseNetConf(config.dump());
  return conf.ok() ? 0 : CniFailureFromStatus(conf.status()).code;
}

ResultV1 SampleResult() {
  ResultV1 result;
  result.interfaces = {{"lxc1a2b3c", "aa:bb:cc:00:00:01", "", 0},
                       {"eth0", "aa:bb:cc:00:00:02", "/var/run/netns/pod1", 1450}};
  result.ips = {{"10.0.1.5/24", "10.0.1.1", 1}, {"fd00::5/64", "", 1}};
  result.routes = {{"0.0.0.0/0", "10.0.1.1"}, {"::/0", ""}};
  result.dns.nameservers = {"10.96.0.10"};
  result.dns.search = {"default.svc.cluster.local"};
  return result;
}

// --- Parsing --------------------------------------------------------------------------------

TEST(ParseNetConf, MinimalConfigGetsDefaults) {
  absl::StatusOr<NetConf> conf = ParseNetConf(MinimalConfig().dump());
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(conf->cni_version, "1.0.0");
  EXPECT_EQ(conf->name, "sluice-net");
  EXPECT_EQ(conf->type, "sluice");
  EXPECT_EQ(conf->socket_path, api::kDefaultSocketPath);
  EXPECT_EQ(conf->mtu, 0);
  EXPECT_TRUE(conf->prev_result.is_null());
  EXPECT_FALSE(conf->has_valid_attachments);
  EXPECT_EQ(conf->raw, MinimalConfig());
}

TEST(ParseNetConf, ReadsOptionalFieldsAndKeepsUnknownOnesInRaw) {
  json config = MinimalConfig("1.1.0");
  config["mtu"] = 1450;
  config["socketPath"] = "/tmp/s.sock";
  config["runtimeConfig"] = {{"portMappings", json::array()}};
  config["dns"] = {{"nameservers", {"10.96.0.10"}}};
  absl::StatusOr<NetConf> conf = ParseNetConf(config.dump());
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(conf->mtu, 1450);
  EXPECT_EQ(conf->socket_path, "/tmp/s.sock");
  EXPECT_EQ(conf->raw, config);
}

TEST(ParseNetConf, ReadsTheRuntimesBandwidthLimits) {
  json config = MinimalConfig("1.1.0");
  config["runtimeConfig"] = {{"bandwidth",
                              {{"ingressRate", 8000000},
                               {"ingressBurst", 4294967295ull},  // containerd: none given
                               {"egressRate", 2000000},
                               {"egressBurst", 80000}}}};
  absl::StatusOr<NetConf> conf = ParseNetConf(config.dump());
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(conf->bandwidth, (BandwidthLimits{8000000, 0, 2000000, 80000}));
  EXPECT_TRUE(conf->bandwidth.any());

  config["runtimeConfig"] = {{"bandwidth", {{"egressRate", 1000}, {"egressBurst", 2147483647}}}};
  conf = ParseNetConf(config.dump());
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(conf->bandwidth, (BandwidthLimits{0, 0, 1000, 0})) << "the kubelet's MaxInt32 burst";

  EXPECT_FALSE(ParseNetConf(MinimalConfig().dump())->bandwidth.any());
  EXPECT_TRUE(conf->bandwidth_status.ok());
}

TEST(ParseNetConf, BadBandwidthLimitsAreInvalidConfigForAddOnly) {
  for (const json& bandwidth : {
           json{{"ingressRate", -1}},
           json{{"ingressRate", 1.5}},
           json{{"ingressRate", "8M"}},
           json{{"ingressRate", 999}},                 // under 1 kbit/s
           json{{"egressRate", 1000000000000001ull}},  // over 1 Pbit/s
           json{{"egressBurst", 100000}},              // a burst without a rate
           json{{"ingressRate", 8000000}, {"ingressBurst", 8 * 4294967296ull}},  // over 4 GiB
           json::array(),
       }) {
    json config = MinimalConfig();
    config["runtimeConfig"] = {{"bandwidth", bandwidth}};
    // Parsed (a DEL of the same configuration must go on), refused for ADD with code 7.
    absl::StatusOr<NetConf> conf = ParseNetConf(config.dump());
    ASSERT_TRUE(conf.ok()) << conf.status();
    EXPECT_EQ(CniCodeOf(conf->bandwidth_status), api::kCniInvalidNetworkConfig) << bandwidth.dump();
    EXPECT_FALSE(conf->bandwidth.any());
  }
  json config = MinimalConfig();
  config["runtimeConfig"] = "bandwidth";
  EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig);
}

TEST(ParseNetConf, NonJsonIsDecodeFailure) {
  absl::StatusOr<NetConf> conf = ParseNetConf("{\"cniVersion\": ");
  ASSERT_FALSE(conf.ok());
  CniFailure failure = CniFailureFromStatus(conf.status());
  EXPECT_EQ(failure.code, api::kCniDecodeFailure);
  EXPECT_FALSE(failure.details.empty());  // the parser's position
}

TEST(ParseNetConf, EmptyInputIsDecodeFailure) {
  EXPECT_EQ(CniFailureFromStatus(ParseNetConf("").status()).code, api::kCniDecodeFailure);
}

TEST(ParseNetConf, NonObjectJsonIsDecodeFailure) {
  EXPECT_EQ(ParseCode(json::array({1, 2})), api::kCniDecodeFailure);
  EXPECT_EQ(ParseCode("a string"), api::kCniDecodeFailure);
}

TEST(ParseNetConf, MissingOrEmptyNameIsInvalidConfig) {
  json config = MinimalConfig();
  config.erase("name");
  EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig);
  config["name"] = "";
  EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig);
  config["name"] = 42;
  EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig);
}

TEST(ParseNetConf, NameWithCharactersOutsideTheCniSetIsInvalidConfig) {
  for (const char* bad : {"my net", "net/1", "-leading-dash", ".hidden", "ünï", "a:b"}) {
    json config = MinimalConfig();
    config["name"] = bad;
    EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig) << bad;
  }
  for (const char* good : {"a", "Sluice_net-1.0", "0net"}) {
    json config = MinimalConfig();
    config["name"] = good;
    EXPECT_EQ(ParseCode(config), 0) << good;
  }
}

TEST(ParseNetConf, MissingOrEmptyCniVersionIsInvalidConfig) {
  json config = MinimalConfig();
  config.erase("cniVersion");
  EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig);
  config["cniVersion"] = "";
  EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig);
  config["cniVersion"] = 1.0;
  EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig);
}

TEST(ParseNetConf, UnsupportedCniVersionIsIncompatibleVersion) {
  for (const char* version : {"0.1.0", "0.2.0", "2.0.0", "1.2.0", "banana"}) {
    absl::StatusOr<NetConf> conf = ParseNetConf(MinimalConfig(version).dump());
    ASSERT_FALSE(conf.ok()) << version;
    CniFailure failure = CniFailureFromStatus(conf.status());
    EXPECT_EQ(failure.code, api::kCniIncompatibleVersion) << version;
    EXPECT_THAT(failure.details, HasSubstr(version));
    EXPECT_THAT(failure.details, HasSubstr("1.1.0"));
  }
}

TEST(ParseNetConf, PrevResultOfAnUnsupportedVersionIsIncompatibleVersion) {
  json config = MinimalConfig("1.1.0");
  config["prevResult"] = {{"cniVersion", "9.9.9"}, {"ips", json::array()}};
  EXPECT_EQ(ParseCode(config), api::kCniIncompatibleVersion);
  config["prevResult"]["cniVersion"] = 7;
  EXPECT_EQ(ParseCode(config), api::kCniIncompatibleVersion);
  config["prevResult"]["cniVersion"] = "0.4.0";
  EXPECT_EQ(ParseCode(config), 0);
  config["prevResult"].erase("cniVersion");
  EXPECT_EQ(ParseCode(config), 0);
}

TEST(ParseNetConf, EverySupportedVersionParses) {
  for (std::string_view version : SupportedVersions()) {
    EXPECT_EQ(ParseCode(MinimalConfig(version)), 0) << version;
  }
}

TEST(ParseNetConf, TypeOtherThanSluiceIsInvalidConfig) {
  json config = MinimalConfig();
  config["type"] = "bridge";
  EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig);
  config.erase("type");
  EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig);
}

TEST(ParseNetConf, IpamSectionIsUnsupportedFieldAndSaysWhy) {
  json config = MinimalConfig();
  config["ipam"] = {{"type", "host-local"}, {"subnet", "10.1.0.0/16"}};
  absl::StatusOr<NetConf> conf = ParseNetConf(config.dump());
  ASSERT_FALSE(conf.ok());
  CniFailure failure = CniFailureFromStatus(conf.status());
  EXPECT_EQ(failure.code, api::kCniUnsupportedField);
  EXPECT_THAT(failure.msg, HasSubstr("ipam"));
  EXPECT_THAT(failure.msg, HasSubstr("Sluice allocates"));
}

TEST(ParseNetConf, MtuOutsideRangeOrNotIntegerIsInvalidConfig) {
  for (json bad :
       {json(575), json(65536), json(0), json(-1), json(1500.5), json("1500"), json(true)}) {
    json config = MinimalConfig();
    config["mtu"] = bad;
    EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig) << bad.dump();
  }
  for (int good : {576, 1500, 9000, 65535}) {
    json config = MinimalConfig();
    config["mtu"] = good;
    EXPECT_EQ(ParseCode(config), 0) << good;
  }
}

TEST(ParseNetConf, SocketPathMustBeAnAbsolutePathThatFitsSunPath) {
  for (json bad : {json(7), json(""), json("relative/sock"), json("/" + std::string(120, 'x'))}) {
    json config = MinimalConfig();
    config["socketPath"] = bad;
    EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig) << bad.dump();
  }
}

TEST(ParseNetConf, KeepsAWellFormedPrevResult) {
  json config = MinimalConfig();
  config["prevResult"] = FormatResult(SampleResult(), "1.0.0");
  absl::StatusOr<NetConf> conf = ParseNetConf(config.dump());
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(conf->prev_result, config["prevResult"]);
}

TEST(ParseNetConf, MalformedPrevResultIsInvalidConfig) {
  json config = MinimalConfig();
  config["prevResult"] = {{"ips", {{{"address", "10.0.0.1/24"}, {"interface", 3}}}}};
  absl::StatusOr<NetConf> conf = ParseNetConf(config.dump());
  ASSERT_FALSE(conf.ok());
  EXPECT_EQ(CniFailureFromStatus(conf.status()).code, api::kCniInvalidNetworkConfig);
  EXPECT_THAT(conf.status().message(), HasSubstr("prevResult"));
}

TEST(ParseNetConf, ReadsGcValidAttachments) {
  json config = MinimalConfig("1.1.0");
  config["cni.dev/valid-attachments"] = {{{"containerID", "c1"}, {"ifname", "eth0"}},
                                         {{"containerID", "c2"}, {"ifname", "net1"}}};
  absl::StatusOr<NetConf> conf = ParseNetConf(config.dump());
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_TRUE(conf->has_valid_attachments);
  EXPECT_THAT(conf->valid_attachments,
              ElementsAre(Attachment{"c1", "eth0"}, Attachment{"c2", "net1"}));
}

TEST(ParseNetConf, EmptyValidAttachmentsListIsPresentAndEmpty) {
  json config = MinimalConfig("1.1.0");
  config["cni.dev/valid-attachments"] = json::array();
  absl::StatusOr<NetConf> conf = ParseNetConf(config.dump());
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_TRUE(conf->has_valid_attachments);
  EXPECT_TRUE(conf->valid_attachments.empty());
}

TEST(ParseNetConf, NullValidAttachmentsIsNoList) {
  json config = MinimalConfig("1.1.0");
  config["cni.dev/valid-attachments"] = nullptr;
  absl::StatusOr<NetConf> conf = NetConfFromJson(config);
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_FALSE(conf->has_valid_attachments);
}

TEST(ParseNetConf, MalformedValidAttachmentsIsInvalidConfig) {
  for (json bad : {json("c1"), json::array({"c1"}), json::array({{{"containerID", "c1"}}}),
                   json::array({{{"containerID", 1}, {"ifname", "eth0"}}})}) {
    json config = MinimalConfig("1.1.0");
    config["cni.dev/valid-attachments"] = bad;
    EXPECT_EQ(ParseCode(config), api::kCniInvalidNetworkConfig) << bad.dump();
  }
}

TEST(SupportedVersionIn, ReturnsOnlySupportedVersions) {
  EXPECT_EQ(SupportedVersionIn(R"({"cniVersion":"0.4.0"})"), "0.4.0");
  EXPECT_EQ(SupportedVersionIn(R"({"cniVersion":"9.9.9"})"), std::nullopt);
  EXPECT_EQ(SupportedVersionIn("garbage"), std::nullopt);
  EXPECT_EQ(SupportedVersionIn(""), std::nullopt);
}

// --- Errors ---------------------------------------------------------------------------------

TEST(CniStatus, CarriesCodeMessageAndDetails) {
  absl::Status status = CniStatus(api::kCniTryAgainLater, "try again", "agent restarting");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(CniCodeOf(status), api::kCniTryAgainLater);
  EXPECT_EQ(CniFailureFromStatus(status),
            (CniFailure{api::kCniTryAgainLater, "try again", "agent restarting"}));
}

TEST(CniStatus, StatusWithoutCodeIsSluiceInternal) {
  CniFailure failure = CniFailureFromStatus(absl::InternalError("map update failed: E2BIG"));
  EXPECT_EQ(failure.code, api::kSluiceInternal);
  EXPECT_EQ(failure.msg, "map update failed: E2BIG");
  EXPECT_EQ(CniCodeOf(absl::NotFoundError("x")), std::nullopt);
}

TEST(FormatError, HasVersionCodeMsgAndDetails) {
  EXPECT_EQ(FormatError(7, "bad", "why", "0.4.0"),
            (json{{"cniVersion", "0.4.0"}, {"code", 7}, {"msg", "bad"}, {"details", "why"}}));
}

TEST(FormatError, OmitsEmptyDetails) {
  EXPECT_EQ(FormatError(CniFailure{11, "later", ""}, "1.1.0"),
            (json{{"cniVersion", "1.1.0"}, {"code", 11}, {"msg", "later"}}));
}

// --- Versions -------------------------------------------------------------------------------

TEST(Versions, SupportedListIsTheContract) {
  EXPECT_THAT(SupportedVersions(), ElementsAre("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"));
  EXPECT_TRUE(IsSupportedVersion("0.3.1"));
  EXPECT_FALSE(IsSupportedVersion("0.2.0"));
}

TEST(Versions, VersionAtLeastComparesNumerically) {
  EXPECT_TRUE(VersionAtLeast("1.1.0", "1.1.0"));
  EXPECT_TRUE(VersionAtLeast("1.10.0", "1.9.0"));
  EXPECT_FALSE(VersionAtLeast("0.4.0", "1.0.0"));
  EXPECT_FALSE(VersionAtLeast("1.0", "0.1.0"));
  EXPECT_FALSE(VersionAtLeast("x.y.z", "0.0.0"));
}

TEST(Versions, VersionInfoListsSupportedVersions) {
  EXPECT_EQ(FormatVersionInfo("0.4.0"),
            (json{{"cniVersion", "0.4.0"},
                  {"supportedVersions", {"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}}}));
}

// --- Results --------------------------------------------------------------------------------

TEST(FormatResult, V1HasNoIpVersionField) {
  for (const char* version : {"1.0.0", "1.1.0"}) {
    json result = FormatResult(SampleResult(), version);
    EXPECT_EQ(result["cniVersion"], version);
    ASSERT_EQ(result["ips"].size(), 2u);
    for (const json& ip : result["ips"]) EXPECT_FALSE(ip.contains("version")) << ip;
  }
}

TEST(FormatResult, BelowV1IpsCarryTheirFamily) {
  for (const char* version : {"0.3.0", "0.3.1", "0.4.0"}) {
    json result = FormatResult(SampleResult(), version);
    EXPECT_EQ(result["cniVersion"], version);
    EXPECT_EQ(result["ips"][0]["version"], "4") << version;
    EXPECT_EQ(result["ips"][1]["version"], "6") << version;
  }
}

TEST(FormatResult, V110DocumentIsExact) {
  EXPECT_EQ(FormatResult(SampleResult(), "1.1.0"), json::parse(R"({
    "cniVersion": "1.1.0",
    "interfaces": [
      {"name": "lxc1a2b3c", "mac": "aa:bb:cc:00:00:01"},
      {"name": "eth0", "mac": "aa:bb:cc:00:00:02", "mtu": 1450, "sandbox": "/var/run/netns/pod1"}
    ],
    "ips": [
      {"address": "10.0.1.5/24", "gateway": "10.0.1.1", "interface": 1},
      {"address": "fd00::5/64", "interface": 1}
    ],
    "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.1.1"}, {"dst": "::/0"}],
    "dns": {"nameservers": ["10.96.0.10"], "search": ["default.svc.cluster.local"]}
  })"));
}

TEST(FormatResult, InterfaceMtuOnlyFrom110) {
  EXPECT_FALSE(FormatResult(SampleResult(), "1.0.0")["interfaces"][1].contains("mtu"));
  EXPECT_EQ(FormatResult(SampleResult(), "1.1.0")["interfaces"][1]["mtu"], 1450);
}

TEST(FormatResult, EmptyResultStillCarriesVersionAndIps) {
  json result = FormatResult(ResultV1{}, "1.0.0");
  EXPECT_EQ(result, (json{{"cniVersion", "1.0.0"}, {"ips", json::array()}}));
}

TEST(ParseResult, RoundTripsEveryVersion) {
  for (std::string_view version : SupportedVersions()) {
    ResultV1 expected = SampleResult();
    if (!VersionAtLeast(version, "1.1.0")) expected.interfaces[1].mtu = 0;  // not carried
    absl::StatusOr<ResultV1> parsed = ParseResult(FormatResult(SampleResult(), version));
    ASSERT_TRUE(parsed.ok()) << version << ": " << parsed.status();
    EXPECT_EQ(*parsed, expected) << version;
  }
}

TEST(ParseResult, IgnoresUnknownFields) {
  json result = FormatResult(SampleResult(), "1.1.0");
  result["interfaces"][0]["socketPath"] = "/x";
  result["routes"][0]["priority"] = 10;
  result["future"] = true;
  absl::StatusOr<ResultV1> parsed = ParseResult(result);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, SampleResult());
}

TEST(ParseResult, RejectsMalformedResults) {
  for (const char* bad : {
           R"([])",
           R"({"interfaces": {}})",
           R"({"interfaces": [{"mac": "aa:bb:cc:dd:ee:ff"}]})",
           R"({"ips": [{"address": "10.0.0.1"}]})",
           R"({"ips": [{"address": "10.0.0.1/24", "interface": 0}]})",
           R"({"ips": [{"address": 5}]})",
           R"({"routes": [{"gw": "10.0.0.1"}]})",
           R"({"dns": {"nameservers": "10.0.0.1"}})",
       }) {
    absl::StatusOr<ResultV1> parsed = ParseResult(json::parse(bad));
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(CniFailureFromStatus(parsed.status()).code, api::kCniInvalidNetworkConfig) << bad;
  }
}

// --- Attachment parameters ------------------------------------------------------------------

TEST(ParseCniArgs, SplitsPairs) {
  absl::StatusOr<std::map<std::string, std::string>> args =
      ParseCniArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(*args, ElementsAre(Pair("IgnoreUnknown", "1"), Pair("K8S_POD_NAME", "b"),
                                 Pair("K8S_POD_NAMESPACE", "a")));
}

TEST(ParseCniArgs, EmptyAndTrailingSeparatorsAreFine) {
  EXPECT_TRUE(ParseCniArgs("")->empty());
  EXPECT_THAT(*ParseCniArgs("A=1;;B=;"), ElementsAre(Pair("A", "1"), Pair("B", "")));
}

TEST(ParseCniArgs, ValueMayContainEquals) {
  EXPECT_THAT(*ParseCniArgs("K8S_POD_UID=a=b"), ElementsAre(Pair("K8S_POD_UID", "a=b")));
}

TEST(ParseCniArgs, PairWithoutEqualsNamesCniArgs) {
  for (const char* bad : {"K8S_POD_NAME", "A=1;oops", "=value"}) {
    absl::StatusOr<std::map<std::string, std::string>> args = ParseCniArgs(bad);
    ASSERT_FALSE(args.ok()) << bad;
    CniFailure failure = CniFailureFromStatus(args.status());
    EXPECT_EQ(failure.code, api::kCniInvalidEnvironment);
    EXPECT_THAT(failure.msg, HasSubstr("CNI_ARGS"));
  }
}

TEST(ValidateContainerId, FollowsTheCniCharacterSet) {
  EXPECT_TRUE(ValidateContainerId("0a1b2c3d_e.f-g").ok());
  for (const char* bad : {"", "-abc", "abc def", "abc/def", "abc;rm"}) {
    absl::Status status = ValidateContainerId(bad);
    ASSERT_FALSE(status.ok()) << bad;
    EXPECT_EQ(CniCodeOf(status), api::kCniInvalidEnvironment);
    EXPECT_THAT(status.message(), HasSubstr("CNI_CONTAINERID"));
  }
}

TEST(ValidateInterfaceName, FollowsLinuxAndCniRules) {
  EXPECT_TRUE(ValidateInterfaceName("eth0").ok());
  EXPECT_TRUE(ValidateInterfaceName("abcdefghijklmno").ok());  // 15
  for (const char* bad : {"", ".", "..", "abcdefghijklmnop", "a/b", "a:b", "a b", "a\tb"}) {
    absl::Status status = ValidateInterfaceName(bad);
    ASSERT_FALSE(status.ok()) << bad;
    EXPECT_EQ(CniCodeOf(status), api::kCniInvalidEnvironment);
    EXPECT_THAT(status.message(), HasSubstr("CNI_IFNAME"));
  }
}

TEST(ValidateInterfaceName, RejectsNonAsciiAndControlBytes) {
  // U+2028 (a Unicode line separator), a lone 0xff, NUL-free control characters, DEL, and a
  // non-ASCII letter: the kernel would take some of these, but no tool prints them unambiguously.
  for (std::string bad : {std::string("e\xe2\x80\xa8"), std::string("eth\xff"), std::string("e\x01"),
                          std::string("e\x7f"), std::string("\xc3\xa9th0"), std::string("e\x1b[0m")}) {
    absl::Status status = ValidateInterfaceName(bad);
    ASSERT_FALSE(status.ok()) << absl::CHexEscape(bad);
    EXPECT_EQ(CniCodeOf(status), api::kCniInvalidEnvironment);
    EXPECT_THAT(status.message(), HasSubstr("CNI_IFNAME"));
    // The error object quotes the value: it must survive a strict JSON dump.
    CniFailure failure = CniFailureFromStatus(status);
    EXPECT_NO_THROW((void)FormatError(failure, "1.1.0").dump()) << absl::CHexEscape(bad);
  }
  EXPECT_TRUE(ValidateInterfaceName("net1_a-b.c").ok());
}

TEST(IsValidUtf8, AcceptsUnicodeAndRejectsMalformedSequences) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9\xe2\x80\xa8\xf0\x9f\x98\x80"));  // é, U+2028, U+1F600
  for (std::string bad : {std::string("\xff"), std::string("\x80"), std::string("\xc3"),
                          std::string("\xc0\xaf"),            // overlong '/'
                          std::string("\xe0\x80\xaf"),        // overlong '/'
                          std::string("\xed\xa0\x80"),        // surrogate U+D800
                          std::string("\xf4\x90\x80\x80"),    // U+110000
                          std::string("a\xe2\x80")}) {         // truncated
    EXPECT_FALSE(IsValidUtf8(bad)) << absl::CHexEscape(bad);
  }
}

TEST(ParseJsonBounded, RefusesDeepNestingWithoutRecursing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  absl::StatusOr<json> parsed = ParseJsonBounded(deep, "network configuration");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(CniCodeOf(parsed.status()), api::kCniDecodeFailure);
  EXPECT_THAT(parsed.status().message(), HasSubstr("deeper than"));

  const std::string at_limit = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseJsonBounded(at_limit, "x").ok());
  const std::string over = "[" + at_limit + "]";
  EXPECT_FALSE(ParseJsonBounded(over, "x").ok());
  // Brackets inside strings (escaped quotes included) do not count.
  const std::string in_string = "{\"a\": \"\\\"" + std::string(1000, '[') + "\"}";
  EXPECT_TRUE(ParseJsonBounded(in_string, "x").ok()) << in_string;
  absl::StatusOr<NetConf> deep_conf = ParseNetConf("{\"cniVersion\":\"1.1.0\",\"x\":" + deep + "}");
  EXPECT_EQ(CniCodeOf(deep_conf.status()), api::kCniDecodeFailure);
}

TEST(ParseCniArgs, RejectsInvalidUtf8AndControlCharacters) {
  for (std::string bad : {std::string("A=\xff"), std::string("A=b\x01"), std::string("\xc0\xaf=1")}) {
    auto args = ParseCniArgs(bad);
    ASSERT_FALSE(args.ok()) << absl::CHexEscape(bad);
    EXPECT_EQ(CniCodeOf(args.status()), api::kCniInvalidEnvironment);
    EXPECT_THAT(args.status().message(), HasSubstr("CNI_ARGS"));
    EXPECT_NO_THROW((void)FormatError(CniFailureFromStatus(args.status()), "1.1.0").dump());
  }
  EXPECT_TRUE(ParseCniArgs("K8S_POD_NAME=caf\xc3\xa9").ok());
}

TEST(ValidateNetnsPath, RejectsRelativeInvalidUtf8AndControlCharacters) {
  EXPECT_TRUE(ValidateNetnsPath("/var/run/netns/p").ok());
  EXPECT_TRUE(ValidateNetnsPath("").ok());  // presence is the caller's check
  for (std::string bad : {std::string("netns/p"), std::string("/x\xff"), std::string("/x\ny")}) {
    absl::Status status = ValidateNetnsPath(bad);
    ASSERT_FALSE(status.ok()) << absl::CHexEscape(bad);
    EXPECT_EQ(CniCodeOf(status), api::kCniInvalidEnvironment);
    EXPECT_THAT(status.message(), HasSubstr("CNI_NETNS"));
    EXPECT_NO_THROW((void)FormatError(CniFailureFromStatus(status), "1.1.0").dump());
  }
}

}  // namespace
}  // namespace sluice::cni
