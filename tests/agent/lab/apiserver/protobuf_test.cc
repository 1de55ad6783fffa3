// The protobuf bodies kubectl's typed clients POST, decoded into the JSON objects they stand for.
#include "agent/lab/apiserver/protobuf.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice::lab {
namespace {

using nlohmann::json;

// What `kubectl create service nodeport web --tcp=80:8080` (v1.32) POSTs, byte for byte (from
// kubectl -v=9).
constexpr char kCreateServiceNodePortBody[] =
    "k8s\x00\x0a\x0d\x0a\x02v1\x12\x07Service\x12\x68"
    "\x0a\x1f\x0a\x03web\x12\x00\x1a\x00\x22\x00\x2a\x00\x32\x00\x38\x00\x42\x00\x5a\x0a\x0a\x03"
    "app\x12\x03web"
    "\x12\x41\x0a\x1b\x0a\x07"
    "80-8080\x12\x03TCP\x18\x50\x22\x07\x08\x00\x10\x90\x3f\x1a\x00\x28\x00"
    "\x12\x0a\x0a\x03"
    "app\x12\x03web\x1a\x00\x22\x08NodePort\x3a\x00\x42\x00\x52\x00\x5a\x00\x60\x00\x68\x00"
    "\x1a\x02\x0a\x00"
    "\x1a\x00\x22\x00";
// 129 bytes: the envelope's 4 + 15 (type meta) + 106 (the raw object) + 4 (encoding, content
// type). Sized from the literal, so no byte past it is read.
const std::string kCreateServiceNodePort(kCreateServiceNodePortBody,
                                         sizeof(kCreateServiceNodePortBody) - 1);

TEST(K8sProtobuf, DecodesWhatKubectlCreateServiceSends) {
  ASSERT_EQ(kCreateServiceNodePort.size(), 0x81u);
  auto got = DecodeK8sProtobuf(kCreateServiceNodePort);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, json::parse(R"({
    "apiVersion": "v1", "kind": "Service",
    "metadata": {"name": "web", "labels": {"app": "web"}},
    "spec": {"type": "NodePort", "selector": {"app": "web"},
             "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}]}
  })"))
      << got->dump();
}

TEST(K8sProtobuf, RejectsOtherBytesAndKindsItDoesNotKnow) {
  EXPECT_EQ(DecodeK8sProtobuf("{\"kind\":\"Service\"}").status().code(),
            absl::StatusCode::kInvalidArgument);
  // Truncated: the raw object's length runs past the end.
  EXPECT_EQ(DecodeK8sProtobuf(kCreateServiceNodePort.substr(0, 40)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto r = DecodeK8sProtobuf(std::string("k8s\x00\x0a\x0c\x0a\x02v1\x12\x06Secret\x12\x00", 20));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
}

}  // namespace
}  // namespace sluice::lab
