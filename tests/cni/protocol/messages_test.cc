#include "cni/protocol/messages.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::cni {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

json Config() { return json{{"cniVersion", "1.1.0"}, {"name", "n"}, {"type", "sluice"}}; }

EndpointRequest AddRequest() {
  return EndpointRequest{"ADD", "ctr1", "/var/run/netns/p", "eth0", "K8S_POD_NAME=a", Config()};
}

TEST(EndpointRequest, RoundTripsThroughTheWireFormat) {
  const std::string wire = EncodeRequest(AddRequest()).dump();
  absl::StatusOr<EndpointRequest> parsed = ParseEndpointRequest(wire);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->command, "ADD");
  EXPECT_EQ(parsed->container_id, "ctr1");
  EXPECT_EQ(parsed->netns, "/var/run/netns/p");
  EXPECT_EQ(parsed->if_name, "eth0");
  EXPECT_EQ(parsed->args, "K8S_POD_NAME=a");
  EXPECT_EQ(parsed->config, Config());
}

TEST(EndpointRequest, WireFieldNamesFollowTheProtocolHeader) {
  json wire = EncodeRequest(AddRequest());
  for (const char* key : {"command", "containerID", "netns", "ifName", "args", "config"}) {
    EXPECT_TRUE(wire.contains(key)) << key;
  }
}

TEST(EndpointRequest, TheNetnsDescriptorFlagRoundTripsAndIsOnlyForAddAndCheck) {
  EndpointRequest add = AddRequest();
  EXPECT_FALSE(EncodeRequest(add).contains("netnsFd"));  // what older agents read unchanged
  add.netns_fd = true;
  absl::StatusOr<EndpointRequest> parsed = ParseEndpointRequest(EncodeRequest(add).dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->netns_fd);
  json wire = EncodeRequest(add);
  wire["netnsFd"] = "yes";
  EXPECT_EQ(CniFailureFromStatus(ParseEndpointRequest(wire.dump()).status()).code,
            api::kCniDecodeFailure);
  wire["netnsFd"] = true;
  wire["command"] = "DEL";
  absl::StatusOr<EndpointRequest> del = ParseEndpointRequest(wire.dump());
  ASSERT_FALSE(del.ok());
  EXPECT_EQ(CniFailureFromStatus(del.status()).code, api::kCniInvalidEnvironment);
  EXPECT_THAT(del.status().message(), HasSubstr("takes no network namespace descriptor"));
}

TEST(EndpointRequest, AContainerIdTooLongForTheAgentsRecordIsInvalidEnvironment) {
  // "<id>-<ifname>.json.tmp" must fit a 255-byte file name.
  EndpointRequest add = AddRequest();
  add.container_id = std::string(kMaxAttachmentKeyBytes - add.if_name.size(), 'c');
  EXPECT_TRUE(ParseEndpointRequest(EncodeRequest(add).dump()).ok());
  add.container_id += "c";
  absl::StatusOr<EndpointRequest> parsed = ParseEndpointRequest(EncodeRequest(add).dump());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(CniFailureFromStatus(parsed.status()).code, api::kCniInvalidEnvironment);
  EXPECT_THAT(parsed.status().message(), HasSubstr("CNI_CONTAINERID is too long"));
  EXPECT_EQ(kMaxAttachmentKeyBytes, 245u);
}

TEST(EndpointRequest, GcAndStatusNeedNoAttachmentParameters) {
  for (const char* command : {"GC", "STATUS"}) {
    json wire = {{"command", command}, {"config", Config()}};
    EXPECT_TRUE(ParseEndpointRequest(wire.dump()).ok()) << command;
  }
}

TEST(EndpointRequest, UndecodableBytesAreDecodeFailure) {
  absl::StatusOr<EndpointRequest> parsed = ParseEndpointRequest("nope");
  EXPECT_EQ(CniFailureFromStatus(parsed.status()).code, api::kCniDecodeFailure);
  json wire = EncodeRequest(AddRequest());
  wire["ifName"] = 3;
  EXPECT_EQ(CniFailureFromStatus(ParseEndpointRequest(wire.dump()).status()).code,
            api::kCniDecodeFailure);
}

TEST(EndpointRequest, MissingConfigIsInvalidNetworkConfig) {
  json wire = EncodeRequest(AddRequest());
  wire.erase("config");
  EXPECT_EQ(CniFailureFromStatus(ParseEndpointRequest(wire.dump()).status()).code,
            api::kCniInvalidNetworkConfig);
}

TEST(EndpointRequest, BadAttachmentParametersNameTheVariable) {
  struct Case {
    const char* field;
    json value;
    const char* variable;
  };
  for (const Case& c :
       {Case{"command", "VERSION", "CNI_COMMAND"}, Case{"containerID", "", "CNI_CONTAINERID"},
        Case{"ifName", "eth0/1", "CNI_IFNAME"}, Case{"netns", "", "CNI_NETNS"},
        Case{"args", "x", "CNI_ARGS"}}) {
    json wire = EncodeRequest(AddRequest());
    wire[c.field] = c.value;
    absl::StatusOr<EndpointRequest> parsed = ParseEndpointRequest(wire.dump());
    ASSERT_FALSE(parsed.ok()) << c.field;
    CniFailure failure = CniFailureFromStatus(parsed.status());
    EXPECT_EQ(failure.code, api::kCniInvalidEnvironment) << c.field;
    EXPECT_THAT(failure.msg, HasSubstr(c.variable));
  }
}

TEST(EndpointRequest, DelMayHaveNoNetns) {
  EndpointRequest request = AddRequest();
  request.command = "DEL";
  request.netns.clear();
  EXPECT_TRUE(ParseEndpointRequest(EncodeRequest(request).dump()).ok());
}

TEST(EndpointReply, SuccessWithAndWithoutResult) {
  absl::StatusOr<EndpointReply> reply = ParseEndpointReply(EncodeSuccessReply());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->ok);
  EXPECT_TRUE(reply->result.is_null());
  EXPECT_EQ(json::parse(EncodeSuccessReply()), (json{{"ok", true}}));

  const json result = {{"cniVersion", "1.1.0"}, {"ips", json::array()}};
  reply = ParseEndpointReply(EncodeSuccessReply(result));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->result, result);
}

TEST(EndpointReply, FailureCarriesCodeMsgDetails) {
  const std::string wire =
      EncodeFailureReply(CniStatus(api::kSluiceInterfaceExists, "eth0 exists", "in /netns/p"));
  EXPECT_EQ(json::parse(wire), (json{{"ok", false},
                                     {"code", api::kSluiceInterfaceExists},
                                     {"msg", "eth0 exists"},
                                     {"details", "in /netns/p"}}));
  absl::StatusOr<EndpointReply> reply = ParseEndpointReply(wire);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_FALSE(reply->ok);
  EXPECT_EQ(reply->failure,
            (CniFailure{api::kSluiceInterfaceExists, "eth0 exists", "in /netns/p"}));
}

TEST(EndpointReply, PlainStatusBecomesSluiceInternal) {
  json wire = json::parse(EncodeFailureReply(absl::InternalError("attach tc ingress: EEXIST")));
  EXPECT_EQ(wire["code"], api::kSluiceInternal);
  EXPECT_EQ(wire["msg"], "attach tc ingress: EEXIST");
}

TEST(EndpointReply, MalformedRepliesAreSluiceInternal) {
  for (const char* bad : {"", "[]", "{}", R"({"ok":"yes"})", R"({"ok":false})",
                          R"({"ok":false,"code":"7"})", R"({"ok":true,"result":[]})"}) {
    absl::StatusOr<EndpointReply> reply = ParseEndpointReply(bad);
    ASSERT_FALSE(reply.ok()) << bad;
    EXPECT_EQ(CniFailureFromStatus(reply.status()).code, api::kSluiceInternal) << bad;
  }
}

}  // namespace
}  // namespace sluice::cni
