#include "agent/lab/apiserver/protobuf.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sluice::lab {

using nlohmann::json;

namespace {

// ---- the wire format ----

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  bool done() const { return pos_ >= b_.size(); }
  bool Varint(uint64_t* out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= b_.size()) return false;
      uint8_t c = static_cast<uint8_t>(b_[pos_++]);
      v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if ((c & 0x80) == 0) {
        *out = v;
        return true;
      }
    }
    return false;
  }
  bool Bytes(std::string_view* out) {
    uint64_t n;
    if (!Varint(&n) || n > b_.size() - pos_) return false;
    *out = b_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool Skip(int wire_type) {
    uint64_t v;
    std::string_view s;
    switch (wire_type) {
      case 0:
        return Varint(&v);
      case 1:
        return Advance(8);
      case 2:
        return Bytes(&s);
      case 5:
        return Advance(4);
      default:
        return false;  // groups are not used by Kubernetes
    }
  }

 private:
  bool Advance(size_t n) {
    if (n > b_.size() - pos_) return false;
    pos_ += n;
    return true;
  }
  std::string_view b_;
  size_t pos_ = 0;
};

// ---- the schema: the fields the lab reads, by number ----

enum class Kind {
  kString,
  kInt,
  kBool,
  kMessage,
  kRepeatedMessage,
  kRepeatedString,
  kStringMap,
  kIntOrString,
  kTime,  // metav1.Time: seconds = 1
};

struct Message;
struct Field {
  int number;
  const char* name;
  Kind kind;
  const Message* message = nullptr;
};
struct Message {
  std::vector<Field> fields;
};

const Message kObjectMeta = {{{1, "name", Kind::kString},
                              {2, "generateName", Kind::kString},
                              {3, "namespace", Kind::kString},
                              {5, "uid", Kind::kString},
                              {6, "resourceVersion", Kind::kString},
                              {11, "labels", Kind::kStringMap},
                              {12, "annotations", Kind::kStringMap},
                              {14, "finalizers", Kind::kRepeatedString}}};
const Message kServicePort = {{{1, "name", Kind::kString},
                               {2, "protocol", Kind::kString},
                               {3, "port", Kind::kInt},
                               {4, "targetPort", Kind::kIntOrString},
                               {5, "nodePort", Kind::kInt},
                               {6, "appProtocol", Kind::kString}}};
const Message kServiceSpec = {{{1, "ports", Kind::kRepeatedMessage, &kServicePort},
                               {2, "selector", Kind::kStringMap},
                               {3, "clusterIP", Kind::kString},
                               {4, "type", Kind::kString},
                               {5, "externalIPs", Kind::kRepeatedString},
                               {7, "sessionAffinity", Kind::kString},
                               {8, "loadBalancerIP", Kind::kString},
                               {9, "loadBalancerSourceRanges", Kind::kRepeatedString},
                               {10, "externalName", Kind::kString},
                               {11, "externalTrafficPolicy", Kind::kString},
                               {12, "healthCheckNodePort", Kind::kInt},
                               {13, "publishNotReadyAddresses", Kind::kBool},
                               {18, "clusterIPs", Kind::kRepeatedString},
                               {17, "ipFamilyPolicy", Kind::kString},
                               {19, "ipFamilies", Kind::kRepeatedString},
                               {21, "loadBalancerClass", Kind::kString},
                               {22, "internalTrafficPolicy", Kind::kString}}};
const Message kService = {
    {{1, "metadata", Kind::kMessage, &kObjectMeta}, {2, "spec", Kind::kMessage, &kServiceSpec}}};
const Message kNamespaceSpec = {{{1, "finalizers", Kind::kRepeatedString}}};
const Message kNamespace = {
    {{1, "metadata", Kind::kMessage, &kObjectMeta}, {2, "spec", Kind::kMessage, &kNamespaceSpec}}};

const Message* MessageOfKind(const std::string& api_version, const std::string& kind) {
  if (api_version != "v1") return nullptr;
  if (kind == "Service") return &kService;
  if (kind == "Namespace") return &kNamespace;
  return nullptr;
}

absl::Status Malformed(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("protobuf body: malformed ", what));
}

absl::StatusOr<json> Decode(std::string_view bytes, const Message& m);

// A map entry (key = 1, value = 2), both strings.
absl::Status DecodeMapEntry(std::string_view bytes, json* map) {
  Reader r(bytes);
  std::string key, value;
  while (!r.done()) {
    uint64_t tag;
    if (!r.Varint(&tag)) return Malformed("map entry");
    std::string_view s;
    if ((tag >> 3) <= 2 && (tag & 7) == 2) {
      if (!r.Bytes(&s)) return Malformed("map entry");
      ((tag >> 3) == 1 ? key : value) = std::string(s);
    } else if (!r.Skip(tag & 7)) {
      return Malformed("map entry");
    }
  }
  (*map)[key] = value;
  return absl::OkStatus();
}

// intstr.IntOrString: type = 1 (0 int, 1 string), intVal = 2, strVal = 3.
absl::StatusOr<json> DecodeIntOrString(std::string_view bytes) {
  Reader r(bytes);
  uint64_t type = 0, int_val = 0;
  std::string str_val;
  while (!r.done()) {
    uint64_t tag;
    if (!r.Varint(&tag)) return Malformed("IntOrString");
    int number = static_cast<int>(tag >> 3);
    std::string_view s;
    if (number == 1 && (tag & 7) == 0) {
      if (!r.Varint(&type)) return Malformed("IntOrString");
    } else if (number == 2 && (tag & 7) == 0) {
      if (!r.Varint(&int_val)) return Malformed("IntOrString");
    } else if (number == 3 && (tag & 7) == 2) {
      if (!r.Bytes(&s)) return Malformed("IntOrString");
      str_val = std::string(s);
    } else if (!r.Skip(tag & 7)) {
      return Malformed("IntOrString");
    }
  }
  if (type == 1) return json(str_val);
  return json(static_cast<int32_t>(int_val));
}

absl::StatusOr<json> Decode(std::string_view bytes, const Message& m) {
  json out = json::object();
  Reader r(bytes);
  while (!r.done()) {
    uint64_t tag;
    if (!r.Varint(&tag)) return Malformed("tag");
    const int number = static_cast<int>(tag >> 3);
    const int wire = static_cast<int>(tag & 7);
    const Field* f = nullptr;
    for (const Field& candidate : m.fields) {
      if (candidate.number == number) f = &candidate;
    }
    const bool varint_field = f != nullptr && (f->kind == Kind::kInt || f->kind == Kind::kBool);
    if (f == nullptr || (varint_field ? wire != 0 : wire != 2)) {
      if (!r.Skip(wire)) return Malformed("field");
      continue;
    }
    if (varint_field) {
      uint64_t v;
      if (!r.Varint(&v)) return Malformed("varint");
      if (v == 0) continue;  // omitempty
      if (f->kind == Kind::kBool) {
        out[f->name] = true;
      } else {
        out[f->name] = static_cast<int64_t>(v);
      }
      continue;
    }
    std::string_view s;
    if (!r.Bytes(&s)) return Malformed("length-delimited field");
    switch (f->kind) {
      case Kind::kString:
        if (!s.empty()) out[f->name] = std::string(s);
        break;
      case Kind::kRepeatedString:
        out[f->name].push_back(std::string(s));
        break;
      case Kind::kStringMap: {
        if (!out.contains(f->name)) out[f->name] = json::object();
        if (absl::Status st = DecodeMapEntry(s, &out[f->name]); !st.ok()) return st;
        break;
      }
      case Kind::kMessage: {
        auto sub = Decode(s, *f->message);
        if (!sub.ok()) return sub.status();
        if (!sub->empty()) out[f->name] = std::move(*sub);
        break;
      }
      case Kind::kRepeatedMessage: {
        auto sub = Decode(s, *f->message);
        if (!sub.ok()) return sub.status();
        out[f->name].push_back(std::move(*sub));
        break;
      }
      case Kind::kIntOrString: {
        auto v = DecodeIntOrString(s);
        if (!v.ok()) return v.status();
        out[f->name] = std::move(*v);
        break;
      }
      default:
        break;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<json> DecodeK8sProtobuf(std::string_view bytes) {
  static constexpr std::string_view kMagic("k8s\0", 4);
  if (bytes.substr(0, 4) != kMagic) return Malformed("envelope (no k8s magic)");
  Reader r(bytes.substr(4));
  std::string api_version, kind;
  std::string_view raw;
  bool have_raw = false;
  while (!r.done()) {
    uint64_t tag;
    if (!r.Varint(&tag)) return Malformed("envelope");
    std::string_view s;
    if ((tag & 7) != 2) {
      if (!r.Skip(tag & 7)) return Malformed("envelope");
      continue;
    }
    if (!r.Bytes(&s)) return Malformed("envelope");
    if ((tag >> 3) == 1) {  // typeMeta: apiVersion = 1, kind = 2
      Reader t(s);
      while (!t.done()) {
        uint64_t ttag;
        std::string_view v;
        if (!t.Varint(&ttag) || (ttag & 7) != 2 || !t.Bytes(&v)) return Malformed("typeMeta");
        if ((ttag >> 3) == 1) api_version = std::string(v);
        if ((ttag >> 3) == 2) kind = std::string(v);
      }
    } else if ((tag >> 3) == 2) {
      raw = s;
      have_raw = true;
    }
  }
  if (!have_raw) return Malformed("envelope (no raw object)");
  const Message* m = MessageOfKind(api_version, kind);
  if (m == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "the lab apiserver decodes protobuf bodies of v1 Service and Namespace only, not ",
        api_version, " ", kind, "; send application/json"));
  }
  auto object = Decode(raw, *m);
  if (!object.ok()) return object.status();
  (*object)["apiVersion"] = api_version;
  (*object)["kind"] = kind;
  if (!object->contains("metadata")) (*object)["metadata"] = json::object();
  return object;
}

}  // namespace sluice::lab
