#include "agent/lab/apiserver/merge_patch.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace sluice::lab {

using nlohmann::json;

namespace {

std::string MergeKeyFor(const std::string& path) {
  auto ends = [&](const char* suffix) {
    return path == suffix || absl::EndsWith(path, absl::StrCat(".", suffix));
  };
  if (ends("containers") || ends("initContainers") || ends("ephemeralContainers") ||
      ends("volumes") || ends("env") || ends("imagePullSecrets")) {
    return "name";
  }
  if (ends("containers.ports") || ends("initContainers.ports") ||
      ends("ephemeralContainers.ports")) {
    return "containerPort";
  }
  if (path == "spec.ports") return "port";  // Service ports
  if (ends("volumeMounts")) return "mountPath";
  if (ends("volumeDevices")) return "devicePath";
  if (ends("hostAliases")) return "ip";
  if (path == "status.conditions") return "type";
  if (path == "status.addresses") return "type";
  if (path == "status.podIPs" || path == "status.hostIPs") return "ip";
  if (path == "metadata.ownerReferences") return "uid";
  if (path == "spec.taints") return "key";
  return "";
}

json StripDirectives(const json& j) {
  if (j.is_object()) {
    json out = json::object();
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (absl::StartsWith(it.key(), "$")) continue;
      out[it.key()] = StripDirectives(it.value());
    }
    return out;
  }
  if (j.is_array()) {
    json out = json::array();
    for (const json& e : j) out.push_back(StripDirectives(e));
    return out;
  }
  return j;
}

json MergeObject(const json& original, const json& patch, const std::string& path);

json MergeList(const json& original, const json& patch, const std::string& key) {
  json result = original.is_array() ? original : json::array();
  for (const json& p : patch) {
    if (!p.is_object() || !p.contains(key)) {
      result.push_back(StripDirectives(p));
      continue;
    }
    auto match = std::find_if(result.begin(), result.end(), [&](const json& e) {
      return e.is_object() && e.contains(key) && e[key] == p[key];
    });
    if (p.value("$patch", "") == "delete") {
      if (match != result.end()) result.erase(match);
      continue;
    }
    if (match != result.end()) {
      *match = MergeObject(*match, p, "");
    } else {
      result.push_back(StripDirectives(p));
    }
  }
  return result;
}

json MergeObject(const json& original, const json& patch, const std::string& path) {
  if (!patch.is_object()) return patch;
  if (patch.value("$patch", "") == "replace") return StripDirectives(patch);
  json result = original.is_object() ? original : json::object();
  std::map<std::string, json> orders;
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    std::string child = path.empty() ? k : path + "." + k;
    if (absl::StartsWith(k, "$setElementOrder/")) {
      orders[k.substr(strlen("$setElementOrder/"))] = v;
    } else if (absl::StartsWith(k, "$deleteFromPrimitiveList/")) {
      std::string field = k.substr(strlen("$deleteFromPrimitiveList/"));
      if (result[field].is_array() && v.is_array()) {
        json kept = json::array();
        for (const json& e : result[field]) {
          if (std::find(v.begin(), v.end(), e) == v.end()) kept.push_back(e);
        }
        result[field] = kept;
      }
    } else if (k == "$retainKeys" || k == "$patch") {
      continue;
    } else if (v.is_null()) {
      result.erase(k);
    } else if (v.is_object()) {
      if (v.value("$patch", "") == "delete") {
        result.erase(k);
      } else {
        result[k] = MergeObject(result.contains(k) ? result[k] : json(), v, child);
      }
    } else if (v.is_array()) {
      std::string key = MergeKeyFor(child);
      result[k] = key.empty() ? StripDirectives(v) : MergeList(result[k], v, key);
    } else {
      result[k] = v;
    }
  }
  if (patch.contains("$retainKeys") && patch["$retainKeys"].is_array()) {
    const json& keep = patch["$retainKeys"];
    for (auto it = result.begin(); it != result.end();) {
      if (std::find(keep.begin(), keep.end(), it.key()) == keep.end()) {
        it = result.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [field, order] : orders) {
    std::string key = MergeKeyFor(path.empty() ? field : path + "." + field);
    if (key.empty() || !result[field].is_array() || !order.is_array()) continue;
    json sorted = json::array();
    json rest = result[field];
    for (const json& o : order) {
      if (!o.is_object() || !o.contains(key)) continue;
      for (auto e = rest.begin(); e != rest.end(); ++e) {
        if (e->is_object() && e->contains(key) && (*e)[key] == o[key]) {
          sorted.push_back(*e);
          rest.erase(e);
          break;
        }
      }
    }
    for (const json& e : rest) sorted.push_back(e);
    result[field] = sorted;
  }
  return result;
}
}  // namespace

json StrategicMergePatch(const json& original, const json& patch) {
  return MergeObject(original, patch, "");
}

}  // namespace sluice::lab
