// The CNI contract shared by sluice-cni and sluice-agent: the network configuration Sluice
// accepts, the CNI error model, spec versions, the Result type and its per-version JSON, and the
// attachment parameters (container ID, interface name, CNI_ARGS).
//
// Error model: every failure is an absl::Status. Failures that the CNI spec gives a code carry it
// in a status payload (CniStatus() builds one, CniFailureFromStatus() reads it back), so a caller
// can turn any status into the {code, msg, details} a CNI error object needs. A status without a
// CNI code maps to sluice::api::kSluiceInternal.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cni/protocol/wire.h"
#include "nlohmann/json.hpp"

namespace sluice::cni {

// --- Errors -------------------------------------------------------------------------------------

// A CNI error as the spec prints it (minus cniVersion, added by FormatError).
struct CniFailure {
  int code = api::kSluiceInternal;
  std::string msg;
  std::string details;

  friend bool operator==(const CniFailure&, const CniFailure&) = default;
};

// Payload type URLs under which a status carries its CNI code and details.
inline constexpr char kCniCodePayloadUrl[] = "type.sluice.dev/cni.code";
inline constexpr char kCniDetailsPayloadUrl[] = "type.sluice.dev/cni.details";

// A non-OK status carrying CNI `code`, `msg` as its message and `details` (if not empty).
[[nodiscard]] absl::Status CniStatus(int code, std::string_view msg, std::string_view details = {});

// The CNI code carried by `status`, if any.
[[nodiscard]] std::optional<int> CniCodeOf(const absl::Status& status);

// {code, msg, details} for a non-OK status: its carried code, or kSluiceInternal when it has none.
[[nodiscard]] CniFailure CniFailureFromStatus(const absl::Status& status);

// The CNI error object: {"cniVersion", "code", "msg", "details"}; "details" is omitted when
// empty (as libcni does).
[[nodiscard]] nlohmann::json FormatError(int code, std::string_view msg, std::string_view details,
                                         std::string_view cni_version);
[[nodiscard]] nlohmann::json FormatError(const CniFailure& failure, std::string_view cni_version);

// --- Hostile input ------------------------------------------------------------------------------

// Deepest nesting of arrays/objects accepted in any JSON Sluice decodes from a runtime or a
// peer; a real network configuration (with a prevResult) nests about 5 levels.
inline constexpr int kMaxJsonDepth = 64;

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points > U+10FFFF).
[[nodiscard]] bool IsValidUtf8(std::string_view text);

// Decodes `bytes` as one JSON document, refusing nesting deeper than `max_depth` before the
// parser sees it (so no input can exhaust the stack). kCniDecodeFailure naming `what` otherwise,
// with the parser's position in the details.
[[nodiscard]] absl::StatusOr<nlohmann::json> ParseJsonBounded(std::string_view bytes,
                                                              std::string_view what,
                                                              int max_depth = kMaxJsonDepth);

// --- Versions -----------------------------------------------------------------------------------

// The newest spec version Sluice speaks; used where no configuration says otherwise.
inline constexpr char kLatestCniVersion[] = "1.1.0";

// "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", oldest first.
[[nodiscard]] std::span<const std::string_view> SupportedVersions();
[[nodiscard]] bool IsSupportedVersion(std::string_view version);

// Semantic comparison of "MAJOR.MINOR.PATCH" versions; false if either does not parse.
[[nodiscard]] bool VersionAtLeast(std::string_view version, std::string_view minimum);

// The VERSION command's answer: {"cniVersion": cni_version, "supportedVersions": [...]}.
[[nodiscard]] nlohmann::json FormatVersionInfo(std::string_view cni_version);

// --- Results ------------------------------------------------------------------------------------

struct ResultInterface {
  std::string name;
  std::string mac;      // empty: omitted
  std::string sandbox;  // netns path for container-side interfaces; empty for host-side ones
  int mtu = 0;          // 0: omitted; only printed for cniVersion >= 1.1.0

  friend bool operator==(const ResultInterface&, const ResultInterface&) = default;
};

struct ResultIp {
  std::string address;           // CIDR, e.g. "10.0.1.5/24" or "fd00::5/64"
  std::string gateway;           // empty: omitted
  std::optional<int> interface;  // index into ResultV1::interfaces

  friend bool operator==(const ResultIp&, const ResultIp&) = default;
};

struct ResultRoute {
  std::string dst;  // CIDR
  std::string gw;   // empty: omitted

  friend bool operator==(const ResultRoute&, const ResultRoute&) = default;
};

struct ResultDns {
  std::vector<std::string> nameservers;
  std::string domain;
  std::vector<std::string> search;
  std::vector<std::string> options;

  friend bool operator==(const ResultDns&, const ResultDns&) = default;
};

// Sluice's internal form of a CNI Result; FormatResult renders it in any supported version.
struct ResultV1 {
  std::vector<ResultInterface> interfaces;
  std::vector<ResultIp> ips;
  std::vector<ResultRoute> routes;
  ResultDns dns;

  friend bool operator==(const ResultV1&, const ResultV1&) = default;
};

// The Result JSON for `cni_version`: always carries "cniVersion"; below 1.0.0 every ip carries
// "version" ("4" or "6", derived from the address); empty optional fields are omitted.
[[nodiscard]] nlohmann::json FormatResult(const ResultV1& result, std::string_view cni_version);

// Reads a Result of any supported version (e.g. a prevResult) back. Unknown fields are ignored;
// wrong types, missing interface names / ip addresses and out-of-range interface indexes fail with
// kCniInvalidNetworkConfig.
[[nodiscard]] absl::StatusOr<ResultV1> ParseResult(const nlohmann::json& json);

// --- Network configuration ----------------------------------------------------------------------

// One entry of GC's "cni.dev/valid-attachments".
struct Attachment {
  std::string container_id;  // "containerID"
  std::string ifname;        // "ifname"

  friend bool operator==(const Attachment&, const Attachment&) = default;
};

using api::kPluginType;
inline constexpr int kMinMtu = 576;
inline constexpr int kMaxMtu = 65535;

// A pod's bandwidth limits: runtimeConfig "bandwidth", which a runtime fills from the pod's
// kubernetes.io/ingress-bandwidth and kubernetes.io/egress-bandwidth annotations for a plugin
// whose conflist entry declares the capability {"bandwidth": true}. Ingress is what the pod
// receives, egress what it sends. Rates in bits per second (0: no limit that way), bursts in bits
// (0: none given; the agent picks one, docs/operating.md "Bandwidth limits").
struct BandwidthLimits {
  uint64_t ingress_rate = 0;
  uint64_t ingress_burst = 0;
  uint64_t egress_rate = 0;
  uint64_t egress_burst = 0;

  bool any() const { return ingress_rate > 0 || egress_rate > 0; }
  friend bool operator==(const BandwidthLimits&, const BandwidthLimits&) = default;
};
// The range of a rate, the kubelet's own for the annotations: 1 kbit/s .. 1 Pbit/s.
inline constexpr uint64_t kMinBandwidthRate = 1000;
inline constexpr uint64_t kMaxBandwidthRate = 1000000000000000;
// The largest burst: what tbf's 32-bit bucket holds, (2^32 - 1) bytes.
inline constexpr uint64_t kMaxBandwidthBurst = 8 * 4294967295ull;
// The bursts runtimes pass when the pod named only a rate (the kubelet's math.MaxInt32,
// containerd's and CRI-O's math.MaxUint32): taken as "none given".
inline constexpr uint64_t kRuntimeUnsetBursts[] = {2147483647ull, 4294967295ull};

// The plugin configuration Sluice accepts. Unknown fields (runtimeConfig, args, capabilities,
// dns, ...) are allowed and kept in `raw`.
struct NetConf {
  std::string cni_version;                            // "cniVersion"
  std::string name;                                   // "name"
  std::string type;                                   // "type", always "sluice"
  std::string socket_path = api::kDefaultSocketPath;  // "socketPath"
  int mtu = 0;                                        // "mtu"; 0: not set, the agent decides
  nlohmann::json prev_result;                         // "prevResult"; null when absent
  std::vector<Attachment> valid_attachments;          // "cni.dev/valid-attachments" (GC)
  bool has_valid_attachments = false;                 // whether that key held a list (not
                                                      // missing, not null)
  BandwidthLimits bandwidth;                          // "runtimeConfig": {"bandwidth"}
  // Why "bandwidth" cannot be enforced (kCniInvalidNetworkConfig), OK otherwise. Not a parse
  // failure: ADD fails with it, while DEL, CHECK and GC of the same configuration (the runtime
  // repeats runtimeConfig) go on, so a pod whose ADD was refused can still be removed.
  absl::Status bandwidth_status;
  nlohmann::json raw;                                 // the whole object, verbatim
};

// Parses and validates the configuration a runtime streams on stdin. Failure codes:
//   kCniDecodeFailure (6): not JSON, or not a JSON object;
//   kCniInvalidNetworkConfig (7): missing/empty/non-string name or cniVersion, a name outside
//     [a-zA-Z0-9][a-zA-Z0-9_.-]*, type not "sluice", mtu not an integer in 576..65535,
//     socketPath not an absolute path that fits a unix socket address, malformed prevResult or
//     cni.dev/valid-attachments;
//   kCniIncompatibleVersion (1): cniVersion, or prevResult's cniVersion, not in
//     SupportedVersions();
//   kCniUnsupportedField (2): an "ipam" section (Sluice allocates addresses itself).
//   kCniInvalidNetworkConfig (7) also: a "runtimeConfig" that is not an object.
// A "bandwidth" in runtimeConfig that is not an object of non-negative integers, a rate outside
// kMinBandwidthRate..kMaxBandwidthRate, or a burst without a rate or above kMaxBandwidthBurst
// (bursts in kRuntimeUnsetBursts read as 0) is kCniInvalidNetworkConfig in bandwidth_status.
[[nodiscard]] absl::StatusOr<NetConf> ParseNetConf(std::string_view stdin_bytes);
// The same for an already decoded document (e.g. the "config" of an endpoint request).
[[nodiscard]] absl::StatusOr<NetConf> NetConfFromJson(const nlohmann::json& json);

// The cniVersion a (possibly invalid) configuration asks for, if it is a supported one; used to
// pick the version of an error object when the configuration itself failed to parse.
[[nodiscard]] std::optional<std::string> SupportedVersionIn(std::string_view stdin_bytes);

// --- Attachment parameters ----------------------------------------------------------------------

// Network names and container IDs: non-empty, [a-zA-Z0-9][a-zA-Z0-9_.-]*.
[[nodiscard]] bool IsValidCniIdentifier(std::string_view id);

// CNI_CONTAINERID: kCniInvalidEnvironment naming `variable` unless IsValidCniIdentifier.
[[nodiscard]] absl::Status ValidateContainerId(std::string_view container_id,
                                               std::string_view variable = "CNI_CONTAINERID");

// The longest container ID and interface name together (bytes): the agent records an attachment
// in "<containerID>-<ifname>.json", written through "<containerID>-<ifname>.json.tmp", and a
// file name holds at most NAME_MAX (255) bytes. A 64-character ID (containerd, CRI-O, podman)
// leaves room for any interface name.
inline constexpr size_t kMaxAttachmentKeyBytes = 255 - (sizeof("-.json.tmp") - 1);

// CNI_CONTAINERID and CNI_IFNAME together: kCniInvalidEnvironment when they are longer than
// kMaxAttachmentKeyBytes, refused up front instead of failing once the pod is half made.
[[nodiscard]] absl::Status ValidateAttachmentKeyLength(std::string_view container_id,
                                                       std::string_view ifname);

// CNI_IFNAME: what Linux accepts as a name (dev_valid_name) and nothing a tool could misread:
// non-empty, at most 15 bytes, not "." or "..", printable ASCII only (no control characters, no
// bytes >= 0x80, so no Unicode separators such as U+2028), no '/', ':' or whitespace;
// kCniInvalidEnvironment naming `variable` otherwise.
[[nodiscard]] absl::Status ValidateInterfaceName(std::string_view ifname,
                                                 std::string_view variable = "CNI_IFNAME");

// CNI_NETNS: an absolute path of valid UTF-8 without control characters (empty is left to the
// per-command presence checks); kCniInvalidEnvironment naming `variable` otherwise.
[[nodiscard]] absl::Status ValidateNetnsPath(std::string_view netns,
                                             std::string_view variable = "CNI_NETNS");

// CNI_ARGS: "K1=V1;K2=V2", valid UTF-8 without control characters. Empty input and empty
// segments (a trailing ';') are allowed; a value may contain '='. A pair without '=' or with an
// empty key fails with kCniInvalidEnvironment naming CNI_ARGS. A repeated key keeps its last
// value.
[[nodiscard]] absl::StatusOr<std::map<std::string, std::string>> ParseCniArgs(
    std::string_view cni_args);

}  // namespace sluice::cni
