#include "agent/lab/apiserver/tables.h"

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/lab/store/json_path.h"

namespace sluice::lab {

using nlohmann::json;

namespace {

constexpr char kNone[] = "<none>";

const json* Path(const json& obj, std::initializer_list<const char*> path) {
  const json* cur = &obj;
  for (const char* p : path) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(p);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

const json& Array(const json& obj, std::initializer_list<const char*> path) {
  static const json kEmpty = json::array();
  const json* v = Path(obj, path);
  return v != nullptr && v->is_array() ? *v : kEmpty;
}

std::string Age(const json& obj, std::initializer_list<const char*> path, absl::Time now) {
  std::string ts = JsonStr(obj, path);
  absl::Time t;
  std::string err;
  if (ts.empty() || !absl::ParseTime(absl::RFC3339_full, ts, &t, &err)) return "<unknown>";
  return HumanDuration(now - t);
}

json Column(const char* name, const char* description, int priority = 0,
            const char* type = "string", const char* format = "") {
  return {{"name", name},
          {"type", type},
          {"format", format},
          {"description", description},
          {"priority", priority}};
}

json NameColumn() {
  return Column("Name", "Name must be unique within a namespace.", 0, "string", "name");
}
json AgeColumn() {
  return Column("Age",
                "CreationTimestamp is a timestamp representing the server time when this object "
                "was created.");
}

// "app=web,tier=fe" from a map of labels, sorted by key (labels.SelectorFromSet().String()).
std::string MapSelector(const json& m) {
  if (!m.is_object() || m.empty()) return kNone;
  std::vector<std::string> parts;
  for (auto it = m.begin(); it != m.end(); ++it) {
    parts.push_back(absl::StrCat(
        it.key(), "=", it.value().is_string() ? it.value().get<std::string>() : it.value().dump()));
  }
  std::sort(parts.begin(), parts.end());
  return absl::StrJoin(parts, ",");
}

// metav1.FormatLabelSelector: matchLabels and matchExpressions; "<none>" when it selects all.
std::string LabelSelectorText(const json& sel) {
  if (!sel.is_object()) return kNone;
  std::vector<std::string> parts;
  if (auto ml = sel.find("matchLabels"); ml != sel.end() && ml->is_object()) {
    for (auto it = ml->begin(); it != ml->end(); ++it) {
      parts.push_back(
          absl::StrCat(it.key(), "=",
                       it.value().is_string() ? it.value().get<std::string>() : it.value().dump()));
    }
  }
  for (const auto& e : Array(sel, {"matchExpressions"})) {
    std::string key = JsonStr(e, {"key"});
    std::string op = JsonStr(e, {"operator"});
    std::vector<std::string> values;
    for (const auto& v : Array(e, {"values"})) {
      if (v.is_string()) values.push_back(v.get<std::string>());
    }
    if (op == "In") {
      parts.push_back(absl::StrCat(key, " in (", absl::StrJoin(values, ","), ")"));
    } else if (op == "NotIn") {
      parts.push_back(absl::StrCat(key, " notin (", absl::StrJoin(values, ","), ")"));
    } else if (op == "Exists") {
      parts.push_back(key);
    } else if (op == "DoesNotExist") {
      parts.push_back("!" + key);
    }
  }
  std::sort(parts.begin(), parts.end());
  return parts.empty() ? kNone : absl::StrJoin(parts, ",");
}

// ---- pods ----

json PodColumns() {
  return json::array(
      {NameColumn(),
       Column("Ready", "The aggregate readiness state of this pod for accepting traffic."),
       Column("Status", "The aggregate status of the containers in this pod."),
       Column("Restarts",
              "The number of times the containers in this pod have been restarted and when the "
              "last container in this pod has restarted."),
       AgeColumn(),
       Column("IP",
              "IP address allocated to the pod. Routable at least within "
              "the cluster. Empty if not yet allocated.",
              1),
       Column("Node", "NodeName is a request to schedule this pod onto a specific node.", 1),
       Column("Nominated Node",
              "nominatedNodeName is set only when this pod preempts other pods on the node.", 1),
       Column("Readiness Gates",
              "If specified, all readiness gates will be evaluated for pod "
              "readiness.",
              1)});
}

json PodCells(const json& pod, absl::Time now) {
  const json& containers = Array(pod, {"spec", "containers"});
  const json& statuses = Array(pod, {"status", "containerStatuses"});
  int total = static_cast<int>(containers.size());
  int ready = 0;
  int64_t restarts = 0;
  std::string reason = JsonStr(pod, {"status", "phase"}, "Pending");
  if (std::string r = JsonStr(pod, {"status", "reason"}); !r.empty()) reason = r;
  for (const auto& cs : statuses) {
    if (cs.value("ready", false) && Path(cs, {"state", "running"}) != nullptr) ++ready;
    if (cs.contains("restartCount") && cs["restartCount"].is_number_integer()) {
      restarts += cs["restartCount"].get<int64_t>();
    }
    if (std::string w = JsonStr(cs, {"state", "waiting", "reason"}); !w.empty()) {
      reason = w;
    } else if (std::string t = JsonStr(cs, {"state", "terminated", "reason"}); !t.empty()) {
      reason = t;
    }
  }
  if (Path(pod, {"metadata", "deletionTimestamp"}) != nullptr &&
      !JsonStr(pod, {"metadata", "deletionTimestamp"}).empty()) {
    reason = "Terminating";
  }
  std::string ip = JsonStr(pod, {"status", "podIP"});
  std::string node = JsonStr(pod, {"spec", "nodeName"});
  std::string nominated = JsonStr(pod, {"status", "nominatedNodeName"});
  const json& gates = Array(pod, {"spec", "readinessGates"});
  std::string gates_text = kNone;
  if (!gates.empty()) {
    int met = 0;
    for (const auto& g : gates) {
      std::string type = JsonStr(g, {"conditionType"});
      for (const auto& c : Array(pod, {"status", "conditions"})) {
        if (JsonStr(c, {"type"}) == type && JsonStr(c, {"status"}) == "True") ++met;
      }
    }
    gates_text = absl::StrCat(met, "/", gates.size());
  }
  return json::array({JsonStr(pod, {"metadata", "name"}), absl::StrCat(ready, "/", total), reason,
                      std::to_string(restarts), Age(pod, {"metadata", "creationTimestamp"}, now),
                      ip.empty() ? kNone : ip, node.empty() ? kNone : node,
                      nominated.empty() ? kNone : nominated, gates_text});
}

// ---- services ----

json ServiceColumns() {
  return json::array({NameColumn(), Column("Type", "type determines how the Service is exposed."),
                      Column("Cluster-IP", "clusterIP is the IP address of the service."),
                      Column("External-IP",
                             "externalIPs is a list of IP addresses for which nodes in the "
                             "cluster will also accept traffic for this service."),
                      Column("Port(s)", "The list of ports that are exposed by this service."),
                      AgeColumn(),
                      Column("Selector",
                             "Route service traffic to pods with label keys and values matching "
                             "this selector.",
                             1)});
}

json ServiceCells(const json& svc, absl::Time now) {
  std::string type = JsonStr(svc, {"spec", "type"}, "ClusterIP");
  std::string cluster_ip = JsonStr(svc, {"spec", "clusterIP"});
  if (cluster_ip.empty()) cluster_ip = kNone;
  std::vector<std::string> external;
  for (const auto& ip : Array(svc, {"spec", "externalIPs"})) {
    if (ip.is_string()) external.push_back(ip.get<std::string>());
  }
  std::string external_text;
  if (type == "LoadBalancer") {
    for (const auto& ing : Array(svc, {"status", "loadBalancer", "ingress"})) {
      std::string a = JsonStr(ing, {"ip"});
      if (a.empty()) a = JsonStr(ing, {"hostname"});
      if (!a.empty()) external.push_back(a);
    }
    external_text = external.empty() ? "<pending>" : absl::StrJoin(external, ",");
  } else if (type == "ExternalName") {
    external_text = JsonStr(svc, {"spec", "externalName"});
  } else {
    external_text = external.empty() ? kNone : absl::StrJoin(external, ",");
  }
  std::vector<std::string> ports;
  for (const auto& p : Array(svc, {"spec", "ports"})) {
    std::string port = p.contains("port") ? p["port"].dump() : "";
    if (p.contains("nodePort") && p["nodePort"].is_number_integer() &&
        p["nodePort"].get<int>() != 0) {
      absl::StrAppend(&port, ":", p["nodePort"].get<int>());
    }
    ports.push_back(absl::StrCat(port, "/", p.value("protocol", "TCP")));
  }
  const json* selector = Path(svc, {"spec", "selector"});
  return json::array({JsonStr(svc, {"metadata", "name"}), type, cluster_ip, external_text,
                      ports.empty() ? kNone : absl::StrJoin(ports, ","),
                      Age(svc, {"metadata", "creationTimestamp"}, now),
                      selector ? MapSelector(*selector) : kNone});
}

// ---- nodes ----

json NodeColumns() {
  return json::array({NameColumn(), Column("Status", "The status of the node"),
                      Column("Roles", "The roles of the node"), AgeColumn(),
                      Column("Version", "Kubelet Version reported by the node."),
                      Column("Internal-IP", "List of addresses reachable to the node.", 1),
                      Column("External-IP", "List of addresses reachable to the node.", 1),
                      Column("OS-Image",
                             "OS Image reported by the node from /etc/os-release "
                             "(e.g. Debian GNU/Linux 7 (wheezy)).",
                             1),
                      Column("Kernel-Version",
                             "Kernel Version reported by the node from 'uname "
                             "-r' (e.g. 3.16.0-0.bpo.4-amd64).",
                             1),
                      Column("Container-Runtime",
                             "Container runtime version reported by the "
                             "node through runtime remote API (e.g. "
                             "containerd://1.4.2).",
                             1)});
}

json NodeCells(const json& node, absl::Time now) {
  std::string status = "Unknown";
  for (const auto& c : Array(node, {"status", "conditions"})) {
    if (JsonStr(c, {"type"}) == "Ready")
      status = JsonStr(c, {"status"}) == "True" ? "Ready" : "NotReady";
  }
  const json* unschedulable = Path(node, {"spec", "unschedulable"});
  if (unschedulable != nullptr && unschedulable->is_boolean() && unschedulable->get<bool>()) {
    status += ",SchedulingDisabled";
  }
  std::vector<std::string> roles;
  if (const json* labels = Path(node, {"metadata", "labels"}); labels && labels->is_object()) {
    for (auto it = labels->begin(); it != labels->end(); ++it) {
      absl::string_view key = it.key();
      if (absl::ConsumePrefix(&key, "node-role.kubernetes.io/") && !key.empty()) {
        roles.emplace_back(key);
      } else if (it.key() == "kubernetes.io/role" && it.value().is_string()) {
        roles.push_back(it.value().get<std::string>());
      }
    }
  }
  std::sort(roles.begin(), roles.end());
  auto address = [&](const char* type) {
    for (const auto& a : Array(node, {"status", "addresses"})) {
      if (JsonStr(a, {"type"}) == type) return JsonStr(a, {"address"});
    }
    return std::string(kNone);
  };
  auto info = [&](const char* field) {
    std::string v = JsonStr(node, {"status", "nodeInfo", field});
    return v.empty() ? std::string("<unknown>") : v;
  };
  return json::array({JsonStr(node, {"metadata", "name"}), status,
                      roles.empty() ? kNone : absl::StrJoin(roles, ","),
                      Age(node, {"metadata", "creationTimestamp"}, now),
                      JsonStr(node, {"status", "nodeInfo", "kubeletVersion"}),
                      address("InternalIP"), address("ExternalIP"), info("osImage"),
                      info("kernelVersion"), info("containerRuntimeVersion")});
}

// ---- the rest ----

json NamespaceColumns() {
  return json::array({NameColumn(), Column("Status", "The status of the namespace"), AgeColumn()});
}

json NamespaceCells(const json& ns, absl::Time now) {
  return json::array({JsonStr(ns, {"metadata", "name"}), JsonStr(ns, {"status", "phase"}, "Active"),
                      Age(ns, {"metadata", "creationTimestamp"}, now)});
}

// At most three, then " + N more...", as kube-apiserver's printers abbreviate.
std::string Abbreviated(const std::vector<std::string>& items) {
  if (items.empty()) return "<unset>";
  if (items.size() <= 3) return absl::StrJoin(items, ",");
  return absl::StrCat(items[0], ",", items[1], ",", items[2], " + ", items.size() - 3, " more...");
}

json EndpointSliceColumns() {
  return json::array(
      {NameColumn(), Column("AddressType", "The IP protocol for this slice (IPv4, IPv6 or FQDN)."),
       Column("Ports", "The ports exposed by the endpoints of this slice."),
       Column("Endpoints", "The addresses of the endpoints of this slice."), AgeColumn()});
}

json EndpointSliceCells(const json& slice, absl::Time now) {
  std::vector<std::string> ports;
  for (const auto& p : Array(slice, {"ports"})) {
    ports.push_back(p.contains("port") && p["port"].is_number_integer() ? p["port"].dump()
                                                                        : "<unset>");
  }
  std::vector<std::string> addresses;
  for (const auto& e : Array(slice, {"endpoints"})) {
    for (const auto& a : Array(e, {"addresses"})) {
      if (a.is_string()) addresses.push_back(a.get<std::string>());
    }
  }
  return json::array({JsonStr(slice, {"metadata", "name"}), JsonStr(slice, {"addressType"}),
                      Abbreviated(ports), Abbreviated(addresses),
                      Age(slice, {"metadata", "creationTimestamp"}, now)});
}

json NetworkPolicyColumns() {
  return json::array({NameColumn(),
                      Column("Pod-Selector",
                             "Selects the pods to which this NetworkPolicy "
                             "object applies."),
                      AgeColumn()});
}

json NetworkPolicyCells(const json& np, absl::Time now) {
  const json* sel = Path(np, {"spec", "podSelector"});
  return json::array({JsonStr(np, {"metadata", "name"}), sel ? LabelSelectorText(*sel) : kNone,
                      Age(np, {"metadata", "creationTimestamp"}, now)});
}

json LeaseColumns() {
  return json::array({NameColumn(),
                      Column("Holder", "The holder of the lease (spec.holderIdentity)."),
                      AgeColumn()});
}

json LeaseCells(const json& lease, absl::Time now) {
  return json::array({JsonStr(lease, {"metadata", "name"}),
                      JsonStr(lease, {"spec", "holderIdentity"}),
                      Age(lease, {"metadata", "creationTimestamp"}, now)});
}

json EventColumns() {
  return json::array(
      {Column("Last Seen",
              "The time at which the most recent occurrence of this event was "
              "recorded."),
       Column("Type",
              "Type of this event (Normal, Warning), new types could be added in the "
              "future."),
       Column("Reason",
              "This should be a short, machine understandable string that gives the "
              "reason for this event being generated."),
       Column("Object", "The object that this event is about."),
       Column("Subobject", "The field of the object this event is about (fieldPath).", 1),
       Column("Source", "The component reporting this event.", 1),
       Column("Message", "A human-readable description of the status of this operation."),
       Column("First Seen", "The time at which the event was first recorded.", 1),
       Column("Count", "The number of times this event has occurred.", 1),
       Column("Name", "Name must be unique within a namespace.", 1, "string", "name")});
}

json EventCells(const json& ev, absl::Time now) {
  std::string last = JsonStr(ev, {"lastTimestamp"}).empty() ? "eventTime" : "lastTimestamp";
  std::string first = JsonStr(ev, {"firstTimestamp"}).empty() ? "eventTime" : "firstTimestamp";
  std::string source = JsonStr(ev, {"source", "component"});
  if (source.empty()) source = JsonStr(ev, {"reportingComponent"});
  if (std::string host = JsonStr(ev, {"source", "host"}); !host.empty()) {
    absl::StrAppend(&source, ", ", host);
  }
  int64_t count = 1;
  if (const json* c = Path(ev, {"count"}); c && c->is_number_integer()) count = c->get<int64_t>();
  std::string object = absl::StrCat(absl::AsciiStrToLower(JsonStr(ev, {"involvedObject", "kind"})),
                                    "/", JsonStr(ev, {"involvedObject", "name"}));
  return json::array({Age(ev, {last.c_str()}, now), JsonStr(ev, {"type"}), JsonStr(ev, {"reason"}),
                      object, JsonStr(ev, {"involvedObject", "fieldPath"}), source,
                      JsonStr(ev, {"message"}), Age(ev, {first.c_str()}, now),
                      std::to_string(count), JsonStr(ev, {"metadata", "name"})});
}

json DefaultColumns() { return json::array({NameColumn(), AgeColumn()}); }

json DefaultCells(const json& obj, absl::Time now) {
  return json::array(
      {JsonStr(obj, {"metadata", "name"}), Age(obj, {"metadata", "creationTimestamp"}, now)});
}

}  // namespace

std::optional<TableRequest> TableRequested(std::string_view accept,
                                           std::string_view include_object) {
  std::optional<TableRequest> out;
  for (absl::string_view media :
       absl::StrSplit(absl::string_view(accept.data(), accept.size()), ',')) {
    std::map<std::string, std::string> params;
    std::vector<absl::string_view> parts = absl::StrSplit(media, ';');
    std::string type(absl::StripAsciiWhitespace(parts[0]));
    for (size_t i = 1; i < parts.size(); ++i) {
      std::vector<std::string> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
      if (kv.size() == 2) {
        params[std::string(absl::StripAsciiWhitespace(kv[0]))] =
            std::string(absl::StripAsciiWhitespace(kv[1]));
      }
    }
    if (type != "application/json" && type != "*/*") continue;
    if (!params.contains("as")) return std::nullopt;  // plain objects come first
    if (params["as"] == "Table" && params["g"] == "meta.k8s.io" &&
        (params["v"] == "v1" || params["v"] == "v1beta1")) {
      out = TableRequest{.api_version = "meta.k8s.io/" + params["v"]};
      break;
    }
  }
  if (!out) return std::nullopt;
  if (include_object == "None") {
    out->row_object = TableRowObject::kNone;
  } else if (include_object == "Object") {
    out->row_object = TableRowObject::kObject;
  }
  return out;
}

std::string HumanDuration(absl::Duration d) {
  int64_t seconds = absl::ToInt64Seconds(d);
  if (seconds < -1) return "<invalid>";
  if (seconds < 0) return "0s";
  if (seconds < 60 * 2) return absl::StrCat(seconds, "s");
  int64_t minutes = seconds / 60;
  if (minutes < 10) {
    int64_t s = seconds % 60;
    return s == 0 ? absl::StrCat(minutes, "m") : absl::StrCat(minutes, "m", s, "s");
  }
  if (minutes < 60 * 3) return absl::StrCat(minutes, "m");
  int64_t hours = minutes / 60;
  if (hours < 8) {
    int64_t m = minutes % 60;
    return m == 0 ? absl::StrCat(hours, "h") : absl::StrCat(hours, "h", m, "m");
  }
  if (hours < 48) return absl::StrCat(hours, "h");
  if (hours < 24 * 8) {
    int64_t h = hours % 24;
    return h == 0 ? absl::StrCat(hours / 24, "d") : absl::StrCat(hours / 24, "d", h, "h");
  }
  if (hours < 24 * 365 * 2) return absl::StrCat(hours / 24, "d");
  if (hours < 24 * 365 * 8) {
    int64_t dy = (hours / 24) % 365;
    return dy == 0 ? absl::StrCat(hours / 24 / 365, "y")
                   : absl::StrCat(hours / 24 / 365, "y", dy, "d");
  }
  return absl::StrCat(hours / 24 / 365, "y");
}

json TableColumns(const ResourceType& type) {
  if (type.plural == "pods") return PodColumns();
  if (type.plural == "services") return ServiceColumns();
  if (type.plural == "nodes") return NodeColumns();
  if (type.plural == "namespaces") return NamespaceColumns();
  if (type.plural == "endpointslices") return EndpointSliceColumns();
  if (type.plural == "networkpolicies") return NetworkPolicyColumns();
  if (type.plural == "leases") return LeaseColumns();
  if (type.plural == "events") return EventColumns();
  return DefaultColumns();
}

json TableCells(const ResourceType& type, const json& object, absl::Time now) {
  if (type.plural == "pods") return PodCells(object, now);
  if (type.plural == "services") return ServiceCells(object, now);
  if (type.plural == "nodes") return NodeCells(object, now);
  if (type.plural == "namespaces") return NamespaceCells(object, now);
  if (type.plural == "endpointslices") return EndpointSliceCells(object, now);
  if (type.plural == "networkpolicies") return NetworkPolicyCells(object, now);
  if (type.plural == "leases") return LeaseCells(object, now);
  if (type.plural == "events") return EventCells(object, now);
  return DefaultCells(object, now);
}

json TableOf(const ResourceType& type, const std::vector<ObjectPtr>& objects,
             const TableRequest& request, absl::Time now, const std::string& resource_version,
             const std::string& continue_token) {
  json metadata = {{"resourceVersion", resource_version}};
  if (!continue_token.empty()) metadata["continue"] = continue_token;
  json rows = json::array();
  for (const ObjectPtr& o : objects) {
    json row = {{"cells", TableCells(type, *o, now)}};
    if (request.row_object == TableRowObject::kObject) {
      row["object"] = *o;
    } else if (request.row_object == TableRowObject::kPartialObjectMetadata) {
      row["object"] = {{"kind", "PartialObjectMetadata"},
                       {"apiVersion", request.api_version},
                       {"metadata", o->value("metadata", json::object())}};
    }
    rows.push_back(std::move(row));
  }
  return {{"kind", "Table"},
          {"apiVersion", request.api_version},
          {"metadata", metadata},
          {"columnDefinitions", TableColumns(type)},
          {"rows", rows}};
}

}  // namespace sluice::lab
