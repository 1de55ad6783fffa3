// Discovery: the documents kubectl and client-go read before they touch a resource (/version,
// /api, /apis, the APIResourceList of every served group version).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/lab/apiserver/internal.h"

namespace sluice::lab {

using nlohmann::json;

namespace {

json ApiResourceList(const std::string& group_version) {
  json resources = json::array();
  for (const ResourceType& r : BuiltinResources()) {
    if (r.ApiVersion() != group_version) continue;
    json entry = {{"name", r.plural},
                  {"singularName", r.singular},
                  {"namespaced", r.namespaced},
                  {"kind", r.kind},
                  {"verbs", json::array({"create", "delete", "deletecollection", "get", "list",
                                         "patch", "update", "watch"})}};
    if (!r.short_names.empty()) entry["shortNames"] = r.short_names;
    if (r.plural == "pods" || r.plural == "services") entry["categories"] = {"all"};
    resources.push_back(entry);
    if (r.plural == "pods") {
      resources.push_back({{"name", "pods/log"},
                           {"singularName", ""},
                           {"namespaced", true},
                           {"kind", "Pod"},
                           {"verbs", json::array({"get"})}});
    }
    if (r.has_status) {
      resources.push_back({{"name", r.plural + "/status"},
                           {"singularName", ""},
                           {"namespaced", r.namespaced},
                           {"kind", r.kind},
                           {"verbs", json::array({"get", "patch", "update"})}});
    }
  }
  return {{"kind", "APIResourceList"},
          {"apiVersion", "v1"},
          {"groupVersion", group_version},
          {"resources", resources}};
}

json ApiGroup(const std::string& name) {
  json gv = {{"groupVersion", name + "/v1"}, {"version", "v1"}};
  return {{"kind", "APIGroup"},
          {"apiVersion", "v1"},
          {"name", name},
          {"versions", json::array({gv})},
          {"preferredVersion", gv}};
}

const std::vector<std::string>& Groups() {
  static const std::vector<std::string> kGroups = {"discovery.k8s.io", "networking.k8s.io",
                                                   "coordination.k8s.io", "apps",
                                                   "rbac.authorization.k8s.io"};
  return kGroups;
}

}  // namespace

std::optional<json> DiscoveryDocument(const std::string& path, const std::string& server_address) {
  if (path == "/version") {
    return json{{"major", "1"},
                {"minor", "32"},
                {"gitVersion", "v1.32.0-sluice-lab"},
                {"gitCommit", "0000000000000000000000000000000000000000"},
                {"gitTreeState", "clean"},
                {"buildDate", "2025-01-01T00:00:00Z"},
                {"goVersion", "go1.23"},
                {"compiler", "gc"},
                {"platform", "linux/amd64"}};
  }
  if (path == "/api") {
    return json{{"kind", "APIVersions"},
                {"versions", {"v1"}},
                {"serverAddressByClientCIDRs",
                 json::array({{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", server_address}}})}};
  }
  if (path == "/apis") {
    json groups = json::array();
    for (const std::string& g : Groups()) {
      json group = ApiGroup(g);
      group.erase("kind");
      group.erase("apiVersion");
      groups.push_back(group);
    }
    return json{{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}};
  }
  if (path == "/api/v1") return ApiResourceList("v1");
  for (const std::string& g : Groups()) {
    if (path == "/apis/" + g) return ApiGroup(g);
    if (path == "/apis/" + g + "/v1") return ApiResourceList(g + "/v1");
  }
  return std::nullopt;
}

}  // namespace sluice::lab
