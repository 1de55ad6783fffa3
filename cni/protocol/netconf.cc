#include "cni/protocol/netconf.h"

#include <sys/un.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "cni/protocol/strings.h"

namespace sluice::cni {
namespace {

using json = nlohmann::json;

constexpr std::array<std::string_view, 5> kSupportedVersions = {"0.3.0", "0.3.1", "0.4.0", "1.0.0",
                                                                "1.1.0"};

constexpr size_t kMaxInterfaceNameLength = 15;  // IFNAMSIZ - 1

absl::StatusCode CanonicalCodeFor(int cni_code) {
  switch (cni_code) {
    case api::kCniIncompatibleVersion:
      return absl::StatusCode::kFailedPrecondition;
    case api::kCniUnsupportedField:
      return absl::StatusCode::kUnimplemented;
    case api::kCniUnknownContainer:
      return absl::StatusCode::kNotFound;
    case api::kCniInvalidEnvironment:
    case api::kCniDecodeFailure:
    case api::kCniInvalidNetworkConfig:
      return absl::StatusCode::kInvalidArgument;
    case api::kCniIoFailure:
      return absl::StatusCode::kDataLoss;
    case api::kCniTryAgainLater:
    case api::kCniNotAvailable:
    case api::kCniLimitedConnectivity:
      return absl::StatusCode::kUnavailable;
    case api::kSluiceInterfaceExists:
      return absl::StatusCode::kAlreadyExists;
    case api::kSluicePoolExhausted:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kInternal;
  }
}

std::optional<std::tuple<int, int, int>> ParseVersion(std::string_view version) {
  std::vector<absl::string_view> parts = absl::StrSplit(AsAbsl(version), '.');
  if (parts.size() != 3) return std::nullopt;
  std::array<int, 3> numbers{};
  for (size_t i = 0; i < 3; ++i) {
    const absl::string_view part = parts[i];
    if (part.empty()) return std::nullopt;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), numbers[i]);
    if (ec != std::errc() || end != part.data() + part.size()) return std::nullopt;
  }
  return std::make_tuple(numbers[0], numbers[1], numbers[2]);
}

absl::Status InvalidConfig(std::string_view msg, std::string_view details = {}) {
  return CniStatus(api::kCniInvalidNetworkConfig, msg, details);
}

// Reads an optional string field; a present non-string is an invalid configuration.
absl::Status ReadOptionalString(const json& object, std::string_view key, std::string_view what,
                                std::string& out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) {
    return InvalidConfig(StrCat(what, " \"", key, "\" must be a string"), it->dump());
  }
  out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadStringList(const json& object, std::string_view key, std::string_view what,
                            std::vector<std::string>& out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) {
    return InvalidConfig(StrCat(what, " \"", key, "\" must be a list of strings"), it->dump());
  }
  for (const json& item : *it) {
    if (!item.is_string()) {
      return InvalidConfig(StrCat(what, " \"", key, "\" must be a list of strings"), it->dump());
    }
    out.push_back(item.get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ParseValidAttachments(const json& value, std::vector<Attachment>& out) {
  constexpr std::string_view kKey = "cni.dev/valid-attachments";
  if (!value.is_array()) {
    return InvalidConfig(StrCat("\"", kKey, "\" must be a list"), value.dump());
  }
  for (const json& entry : value) {
    if (!entry.is_object()) {
      return InvalidConfig(StrCat("\"", kKey, "\" entries must be objects"), entry.dump());
    }
    auto id = entry.find("containerID");
    auto ifname = entry.find("ifname");
    if (id == entry.end() || !id->is_string() || ifname == entry.end() || !ifname->is_string()) {
      return InvalidConfig(
          StrCat("\"", kKey, "\" entries need string \"containerID\" and \"ifname\""),
          entry.dump());
    }
    out.push_back({id->get<std::string>(), ifname->get<std::string>()});
  }
  return absl::OkStatus();
}

// Printable text for an error's details: valid UTF-8 verbatim, anything else C-escaped.
std::string QuoteHostile(std::string_view value) {
  return IsValidUtf8(value) ? std::string(value) : absl::CHexEscape(AsAbsl(value));
}

bool HasControlCharacter(std::string_view value) {
  for (char c : value) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) return true;
  }
  return false;
}

}  // namespace

// --- Errors -------------------------------------------------------------------------------------

absl::Status CniStatus(int code, std::string_view msg, std::string_view details) {
  absl::Status status(CanonicalCodeFor(code), AsAbsl(msg));
  status.SetPayload(kCniCodePayloadUrl, absl::Cord(StrCat(code)));
  if (!details.empty()) status.SetPayload(kCniDetailsPayloadUrl, absl::Cord(AsAbsl(details)));
  return status;
}

std::optional<int> CniCodeOf(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kCniCodePayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  const std::string text(*payload);
  int code = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), code);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return code;
}

CniFailure CniFailureFromStatus(const absl::Status& status) {
  CniFailure failure;
  failure.code = CniCodeOf(status).value_or(api::kSluiceInternal);
  failure.msg = std::string(status.message());
  if (failure.msg.empty()) failure.msg = absl::StatusCodeToString(status.code());
  if (absl::optional<absl::Cord> details = status.GetPayload(kCniDetailsPayloadUrl)) {
    failure.details = std::string(*details);
  }
  return failure;
}

json FormatError(int code, std::string_view msg, std::string_view details,
                 std::string_view cni_version) {
  json error = json::object();
  error["cniVersion"] = cni_version;
  error["code"] = code;
  error["msg"] = msg;
  if (!details.empty()) error["details"] = details;
  return error;
}

json FormatError(const CniFailure& failure, std::string_view cni_version) {
  return FormatError(failure.code, failure.msg, failure.details, cni_version);
}

// --- Hostile input ------------------------------------------------------------------------------

bool IsValidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char lead = *p;
    if (lead < 0x80) {
      ++p;
      continue;
    }
    int extra;
    uint32_t code;
    if (lead >= 0xc2 && lead <= 0xdf) {
      extra = 1;
      code = lead & 0x1f;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      extra = 2;
      code = lead & 0x0f;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      extra = 3;
      code = lead & 0x07;
    } else {
      return false;  // a continuation byte, an overlong 2-byte lead (c0, c1) or > U+10FFFF
    }
    if (end - p <= extra) return false;
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xc0) != 0x80) return false;
      code = (code << 6) | (p[i] & 0x3f);
    }
    if ((extra == 2 && code < 0x800) || (extra == 3 && code < 0x10000) || code > 0x10ffff ||
        (code >= 0xd800 && code <= 0xdfff)) {
      return false;  // overlong, beyond Unicode, or a UTF-16 surrogate
    }
    p += extra + 1;
  }
  return true;
}

absl::StatusOr<json> ParseJsonBounded(std::string_view bytes, std::string_view what,
                                      int max_depth) {
  // Structural characters only count outside strings; inside one, a backslash escapes the next
  // byte. Malformed input is left for the parser to describe.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return CniStatus(api::kCniDecodeFailure,
                         StrCat(what, " nests arrays/objects deeper than ", max_depth, " levels"),
                         StrCat("at byte ", i));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  json value = json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (!value.is_discarded()) return value;
  // Re-parse with exceptions only to get the position of the error into the details; the depth
  // is bounded, so this cannot recurse out of stack either.
  std::string details;
  try {
    json ignored = json::parse(bytes);
  } catch (const json::exception& e) {
    details = e.what();
  }
  return CniStatus(api::kCniDecodeFailure, StrCat(what, " is not valid JSON"), details);
}

// --- Versions -----------------------------------------------------------------------------------

std::span<const std::string_view> SupportedVersions() { return kSupportedVersions; }

bool IsSupportedVersion(std::string_view version) {
  for (std::string_view supported : kSupportedVersions) {
    if (supported == version) return true;
  }
  return false;
}

bool VersionAtLeast(std::string_view version, std::string_view minimum) {
  auto have = ParseVersion(version);
  auto want = ParseVersion(minimum);
  return have.has_value() && want.has_value() && *have >= *want;
}

json FormatVersionInfo(std::string_view cni_version) {
  json versions = json::array();
  for (std::string_view version : kSupportedVersions) versions.push_back(version);
  return json{{"cniVersion", cni_version}, {"supportedVersions", std::move(versions)}};
}

// --- Results ------------------------------------------------------------------------------------

json FormatResult(const ResultV1& result, std::string_view cni_version) {
  const bool below_v1 = !VersionAtLeast(cni_version, "1.0.0");
  const bool has_v11_fields = VersionAtLeast(cni_version, "1.1.0");

  json out = json::object();
  out["cniVersion"] = cni_version;
  if (!result.interfaces.empty()) {
    json interfaces = json::array();
    for (const ResultInterface& interface : result.interfaces) {
      json entry = {{"name", interface.name}};
      if (!interface.mac.empty()) entry["mac"] = interface.mac;
      if (has_v11_fields && interface.mtu > 0) entry["mtu"] = interface.mtu;
      if (!interface.sandbox.empty()) entry["sandbox"] = interface.sandbox;
      interfaces.push_back(std::move(entry));
    }
    out["interfaces"] = std::move(interfaces);
  }
  json ips = json::array();
  for (const ResultIp& ip : result.ips) {
    json entry = json::object();
    if (below_v1) {
      entry["version"] = ip.address.find(':') == std::string::npos ? "4" : "6";
    }
    entry["address"] = ip.address;
    if (!ip.gateway.empty()) entry["gateway"] = ip.gateway;
    if (ip.interface.has_value()) entry["interface"] = *ip.interface;
    ips.push_back(std::move(entry));
  }
  out["ips"] = std::move(ips);
  if (!result.routes.empty()) {
    json routes = json::array();
    for (const ResultRoute& route : result.routes) {
      json entry = {{"dst", route.dst}};
      if (!route.gw.empty()) entry["gw"] = route.gw;
      routes.push_back(std::move(entry));
    }
    out["routes"] = std::move(routes);
  }
  json dns = json::object();
  if (!result.dns.nameservers.empty()) dns["nameservers"] = result.dns.nameservers;
  if (!result.dns.domain.empty()) dns["domain"] = result.dns.domain;
  if (!result.dns.search.empty()) dns["search"] = result.dns.search;
  if (!result.dns.options.empty()) dns["options"] = result.dns.options;
  // 0.3.x/0.4.0 results always carried a (possibly empty) dns object; 1.x makes it optional.
  if (!dns.empty() || below_v1) out["dns"] = std::move(dns);
  return out;
}

absl::StatusOr<ResultV1> ParseResult(const json& value) {
  if (!value.is_object()) return InvalidConfig("result must be a JSON object", value.dump());
  ResultV1 result;

  if (auto it = value.find("interfaces"); it != value.end() && !it->is_null()) {
    if (!it->is_array()) return InvalidConfig("result \"interfaces\" must be a list", it->dump());
    for (const json& entry : *it) {
      if (!entry.is_object()) return InvalidConfig("result interface must be an object");
      ResultInterface interface;
      if (absl::Status s = ReadOptionalString(entry, "name", "result interface", interface.name);
          !s.ok()) {
        return s;
      }
      if (interface.name.empty()) {
        return InvalidConfig("result interface has no \"name\"", entry.dump());
      }
      if (absl::Status s = ReadOptionalString(entry, "mac", "result interface", interface.mac);
          !s.ok()) {
        return s;
      }
      if (absl::Status s =
              ReadOptionalString(entry, "sandbox", "result interface", interface.sandbox);
          !s.ok()) {
        return s;
      }
      if (auto mtu = entry.find("mtu"); mtu != entry.end() && !mtu->is_null()) {
        if (!mtu->is_number_integer() || mtu->get<int64_t>() < 0 || mtu->get<int64_t>() > kMaxMtu) {
          return InvalidConfig("result interface \"mtu\" must be an integer", entry.dump());
        }
        interface.mtu = mtu->get<int>();
      }
      result.interfaces.push_back(std::move(interface));
    }
  }

  if (auto it = value.find("ips"); it != value.end() && !it->is_null()) {
    if (!it->is_array()) return InvalidConfig("result \"ips\" must be a list", it->dump());
    for (const json& entry : *it) {
      if (!entry.is_object()) return InvalidConfig("result ip must be an object");
      ResultIp ip;
      if (absl::Status s = ReadOptionalString(entry, "address", "result ip", ip.address); !s.ok()) {
        return s;
      }
      if (ip.address.find('/') == std::string::npos) {
        return InvalidConfig("result ip needs an \"address\" in CIDR form", entry.dump());
      }
      if (absl::Status s = ReadOptionalString(entry, "gateway", "result ip", ip.gateway); !s.ok()) {
        return s;
      }
      if (auto index = entry.find("interface"); index != entry.end() && !index->is_null()) {
        if (!index->is_number_integer() || index->get<int64_t>() < 0 ||
            index->get<int64_t>() >= static_cast<int64_t>(result.interfaces.size())) {
          return InvalidConfig("result ip \"interface\" is not an index into \"interfaces\"",
                               entry.dump());
        }
        ip.interface = index->get<int>();
      }
      result.ips.push_back(std::move(ip));
    }
  }

  if (auto it = value.find("routes"); it != value.end() && !it->is_null()) {
    if (!it->is_array()) return InvalidConfig("result \"routes\" must be a list", it->dump());
    for (const json& entry : *it) {
      if (!entry.is_object()) return InvalidConfig("result route must be an object");
      ResultRoute route;
      if (absl::Status s = ReadOptionalString(entry, "dst", "result route", route.dst); !s.ok()) {
        return s;
      }
      if (route.dst.empty()) return InvalidConfig("result route has no \"dst\"", entry.dump());
      if (absl::Status s = ReadOptionalString(entry, "gw", "result route", route.gw); !s.ok()) {
        return s;
      }
      result.routes.push_back(std::move(route));
    }
  }

  if (auto it = value.find("dns"); it != value.end() && !it->is_null()) {
    if (!it->is_object()) return InvalidConfig("result \"dns\" must be an object", it->dump());
    for (absl::Status s : {ReadStringList(*it, "nameservers", "result dns", result.dns.nameservers),
                           ReadOptionalString(*it, "domain", "result dns", result.dns.domain),
                           ReadStringList(*it, "search", "result dns", result.dns.search),
                           ReadStringList(*it, "options", "result dns", result.dns.options)}) {
      if (!s.ok()) return s;
    }
  }
  return result;
}

// --- Network configuration ----------------------------------------------------------------------

namespace {

// runtimeConfig.bandwidth into `out`; see ParseNetConf for what is refused.
absl::Status ParseBandwidth(const json& bandwidth, BandwidthLimits& out) {
  if (!bandwidth.is_object()) {
    return InvalidConfig("runtimeConfig \"bandwidth\" must be a JSON object", bandwidth.dump());
  }
  auto field = [&](const char* key, uint64_t& into) -> absl::Status {
    auto it = bandwidth.find(key);
    if (it == bandwidth.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
      return InvalidConfig(
          StrCat("runtimeConfig bandwidth \"", key, "\" must be a non-negative integer"),
          it->dump());
    }
    into = it->get<uint64_t>();
    return absl::OkStatus();
  };
  for (auto [key, into] :
       {std::pair{"ingressRate", &out.ingress_rate}, std::pair{"ingressBurst", &out.ingress_burst},
        std::pair{"egressRate", &out.egress_rate}, std::pair{"egressBurst", &out.egress_burst}}) {
    if (absl::Status s = field(key, *into); !s.ok()) return s;
  }
  auto check = [](const char* dir, uint64_t rate, uint64_t& burst) -> absl::Status {
    for (uint64_t unset : kRuntimeUnsetBursts) {
      if (burst == unset) burst = 0;
    }
    if (rate == 0 && burst > 0) {
      return InvalidConfig(StrCat("runtimeConfig bandwidth: ", dir, "Burst without ", dir, "Rate"),
                           StrCat(dir, "Burst ", burst));
    }
    if (rate > 0 && (rate < kMinBandwidthRate || rate > kMaxBandwidthRate)) {
      return InvalidConfig(
          StrCat("runtimeConfig bandwidth: ", dir, "Rate must be ", kMinBandwidthRate, "..",
                 kMaxBandwidthRate, " bits/s (1 kbit/s .. 1 Pbit/s)"),
          StrCat(dir, "Rate ", rate));
    }
    if (burst > kMaxBandwidthBurst) {
      return InvalidConfig(StrCat("runtimeConfig bandwidth: ", dir, "Burst must be at most ",
                                  kMaxBandwidthBurst, " bits (4 GiB)"),
                           StrCat(dir, "Burst ", burst));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check("ingress", out.ingress_rate, out.ingress_burst); !s.ok()) return s;
  return check("egress", out.egress_rate, out.egress_burst);
}

}  // namespace

absl::StatusOr<NetConf> NetConfFromJson(const json& value) {
  if (!value.is_object()) {
    return CniStatus(api::kCniDecodeFailure, "network configuration must be a JSON object",
                     value.dump());
  }
  NetConf conf;
  conf.raw = value;

  auto version = value.find("cniVersion");
  if (version == value.end() || !version->is_string() || version->get<std::string>().empty()) {
    return InvalidConfig("network configuration needs a non-empty string \"cniVersion\"");
  }
  conf.cni_version = version->get<std::string>();
  if (!IsSupportedVersion(conf.cni_version)) {
    return CniStatus(api::kCniIncompatibleVersion, "incompatible CNI versions",
                     StrCat("config is \"", conf.cni_version, "\", plugin supports ",
                            FormatVersionInfo(conf.cni_version)["supportedVersions"].dump()));
  }

  auto name = value.find("name");
  if (name == value.end() || !name->is_string() || name->get<std::string>().empty()) {
    return InvalidConfig("network configuration needs a non-empty string \"name\"");
  }
  conf.name = name->get<std::string>();
  if (!IsValidCniIdentifier(conf.name)) {
    return InvalidConfig(
        "invalid network name: must start with [a-zA-Z0-9] and contain only [a-zA-Z0-9_.-]",
        conf.name);
  }

  auto type = value.find("type");
  if (type == value.end() || !type->is_string() || type->get<std::string>() != kPluginType) {
    return InvalidConfig(StrCat("network configuration \"type\" must be \"", kPluginType, "\""),
                         type == value.end() ? "" : type->dump());
  }
  conf.type = kPluginType;

  if (auto ipam = value.find("ipam"); ipam != value.end() && !ipam->is_null()) {
    return CniStatus(api::kCniUnsupportedField,
                     "\"ipam\" is not supported: Sluice allocates pod addresses itself "
                     "(agent ipam.mode); remove the \"ipam\" section",
                     ipam->dump());
  }

  if (auto mtu = value.find("mtu"); mtu != value.end() && !mtu->is_null()) {
    if (!mtu->is_number_integer() || mtu->get<int64_t>() < kMinMtu ||
        mtu->get<int64_t>() > kMaxMtu) {
      return InvalidConfig(StrCat("\"mtu\" must be an integer in ", kMinMtu, "..", kMaxMtu),
                           mtu->dump());
    }
    conf.mtu = mtu->get<int>();
  }

  if (auto path = value.find("socketPath"); path != value.end() && !path->is_null()) {
    if (!path->is_string()) return InvalidConfig("\"socketPath\" must be a string", path->dump());
    std::string socket_path = path->get<std::string>();
    if (socket_path.empty() || socket_path.front() != '/') {
      return InvalidConfig("\"socketPath\" must be an absolute path", socket_path);
    }
    if (socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
      return InvalidConfig(StrCat("\"socketPath\" is longer than a unix socket address (",
                                  sizeof(sockaddr_un::sun_path) - 1, " bytes)"),
                           socket_path);
    }
    conf.socket_path = std::move(socket_path);
  }

  if (auto prev = value.find("prevResult"); prev != value.end() && !prev->is_null()) {
    if (!prev->is_object()) return InvalidConfig("\"prevResult\" must be a JSON object", prev->dump());
    // The runtime hands prevResult over in the configuration's version (libcni converts it);
    // a version the plugin does not know is one it cannot read.
    if (auto version = prev->find("cniVersion"); version != prev->end() && !version->is_null()) {
      if (!version->is_string() || !IsSupportedVersion(version->get<std::string>())) {
        return CniStatus(api::kCniIncompatibleVersion, "incompatible CNI versions",
                         StrCat("prevResult is \"", version->is_string() ? version->get<std::string>() : version->dump(),
                                "\", plugin supports ",
                                FormatVersionInfo(conf.cni_version)["supportedVersions"].dump()));
      }
    }
    absl::StatusOr<ResultV1> parsed = ParseResult(*prev);
    if (!parsed.ok()) {
      return InvalidConfig(StrCat("invalid \"prevResult\": ", parsed.status().message()),
                           CniFailureFromStatus(parsed.status()).details);
    }
    conf.prev_result = *prev;
  }

  // GC: a missing or null list means the runtime named no attachments (libcni omits the key
  // when it has no list, and Go prints an absent list as null); see docs/operating.md.
  if (auto attachments = value.find("cni.dev/valid-attachments");
      attachments != value.end() && !attachments->is_null()) {
    if (absl::Status s = ParseValidAttachments(*attachments, conf.valid_attachments); !s.ok()) {
      return s;
    }
    conf.has_valid_attachments = true;
  }

  if (auto runtime = value.find("runtimeConfig"); runtime != value.end() && !runtime->is_null()) {
    if (!runtime->is_object()) {
      return InvalidConfig("\"runtimeConfig\" must be a JSON object", runtime->dump());
    }
    if (auto bw = runtime->find("bandwidth"); bw != runtime->end() && !bw->is_null()) {
      conf.bandwidth_status = ParseBandwidth(*bw, conf.bandwidth);
      if (!conf.bandwidth_status.ok()) conf.bandwidth = {};
    }
  }
  return conf;
}

absl::StatusOr<NetConf> ParseNetConf(std::string_view stdin_bytes) {
  absl::StatusOr<json> value = ParseJsonBounded(stdin_bytes, "network configuration");
  if (!value.ok()) return value.status();
  return NetConfFromJson(*value);
}

std::optional<std::string> SupportedVersionIn(std::string_view stdin_bytes) {
  absl::StatusOr<json> value = ParseJsonBounded(stdin_bytes, "network configuration");
  if (!value.ok() || !value->is_object()) return std::nullopt;
  auto version = value->find("cniVersion");
  if (version == value->end() || !version->is_string()) return std::nullopt;
  std::string text = version->get<std::string>();
  if (!IsSupportedVersion(text)) return std::nullopt;
  return text;
}

// --- Attachment parameters ----------------------------------------------------------------------

bool IsValidCniIdentifier(std::string_view id) {
  if (id.empty() || !absl::ascii_isalnum(static_cast<unsigned char>(id.front()))) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return false;
    }
  }
  return true;
}

absl::Status ValidateContainerId(std::string_view container_id, std::string_view variable) {
  if (container_id.empty()) {
    return CniStatus(api::kCniInvalidEnvironment, StrCat(variable, " is empty"));
  }
  if (!IsValidCniIdentifier(container_id)) {
    return CniStatus(api::kCniInvalidEnvironment,
                     StrCat(variable,
                            " has invalid characters: must start with [a-zA-Z0-9] and "
                            "contain only [a-zA-Z0-9_.-]"),
                     QuoteHostile(container_id));
  }
  return absl::OkStatus();
}

absl::Status ValidateAttachmentKeyLength(std::string_view container_id, std::string_view ifname) {
  if (container_id.size() + ifname.size() <= kMaxAttachmentKeyBytes) return absl::OkStatus();
  return CniStatus(
      api::kCniInvalidEnvironment,
      StrCat("CNI_CONTAINERID is too long: ", container_id.size(), " bytes; with CNI_IFNAME \"",
             ifname, "\" at most ", kMaxAttachmentKeyBytes - std::min(ifname.size(), kMaxAttachmentKeyBytes),
             " fit (the agent's record of the attachment is a file named after both)"));
}

absl::Status ValidateInterfaceName(std::string_view ifname, std::string_view variable) {
  // The details quote the value, so they must stay printable JSON whatever the bytes were.
  auto invalid = [&](std::string_view why) {
    return CniStatus(api::kCniInvalidEnvironment, StrCat(variable, " ", why),
                     QuoteHostile(ifname));
  };
  if (ifname.empty()) return invalid("is empty");
  if (ifname.size() > kMaxInterfaceNameLength) {
    return invalid(StrCat("is longer than ", kMaxInterfaceNameLength, " characters"));
  }
  if (ifname == "." || ifname == "..") return invalid("must not be \".\" or \"..\"");
  for (char c : ifname) {
    if (c == '/' || c == ':' || absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return invalid("must not contain '/', ':' or whitespace");
    }
  }
  for (char c : ifname) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x21 || byte > 0x7e) {
      return invalid(
          "must contain only printable ASCII characters (no control characters, no non-ASCII "
          "bytes)");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateNetnsPath(std::string_view netns, std::string_view variable) {
  if (netns.empty()) return absl::OkStatus();
  if (!IsValidUtf8(netns)) {
    return CniStatus(api::kCniInvalidEnvironment, StrCat(variable, " is not valid UTF-8"),
                     QuoteHostile(netns));
  }
  if (HasControlCharacter(netns)) {
    return CniStatus(api::kCniInvalidEnvironment,
                     StrCat(variable, " must not contain control characters"),
                     absl::CHexEscape(AsAbsl(netns)));
  }
  if (netns.front() != '/') {
    return CniStatus(api::kCniInvalidEnvironment, StrCat(variable, " must be an absolute path"),
                     netns);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> ParseCniArgs(std::string_view cni_args) {
  if (!IsValidUtf8(cni_args)) {
    return CniStatus(api::kCniInvalidEnvironment, "CNI_ARGS is not valid UTF-8",
                     QuoteHostile(cni_args));
  }
  if (HasControlCharacter(cni_args)) {
    return CniStatus(api::kCniInvalidEnvironment, "CNI_ARGS must not contain control characters",
                     absl::CHexEscape(AsAbsl(cni_args)));
  }
  std::map<std::string, std::string> args;
  for (absl::string_view absl_pair : absl::StrSplit(AsAbsl(cni_args), ';', absl::SkipEmpty())) {
    const std::string_view pair(absl_pair.data(), absl_pair.size());
    const size_t eq = pair.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return CniStatus(api::kCniInvalidEnvironment,
                       StrCat("CNI_ARGS: invalid pair \"", pair, "\", want KEY=VALUE"), cni_args);
    }
    args[std::string(pair.substr(0, eq))] = std::string(pair.substr(eq + 1));
  }
  return args;
}

}  // namespace sluice::cni
