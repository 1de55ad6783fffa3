// Kubernetes' protobuf wire format, decoded into the JSON object it stands for, for the kinds the
// lab is sent as protobuf. kubectl's typed clients (`kubectl create service|namespace`) POST
// `application/vnd.kubernetes.protobuf`: the magic "k8s\0", then a runtime.Unknown whose typeMeta
// names apiVersion and kind and whose raw bytes are the object's message. Fields are read by
// their numbers in k8s.io/api's generated.proto; zero values are left out (as omitempty does in
// JSON), unknown fields skipped.
#ifndef SLUICE_AGENT_LAB_APISERVER_PROTOBUF_H_
#define SLUICE_AGENT_LAB_APISERVER_PROTOBUF_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace sluice::lab {

inline constexpr char kProtobufContentType[] = "application/vnd.kubernetes.protobuf";

// Errors: InvalidArgument for bytes that are not the envelope or not valid protobuf;
// Unimplemented for a kind the lab does not decode (it decodes v1 Service and Namespace).
absl::StatusOr<nlohmann::json> DecodeK8sProtobuf(std::string_view bytes);

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_APISERVER_PROTOBUF_H_
