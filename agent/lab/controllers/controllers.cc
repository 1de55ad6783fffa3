#include "agent/lab/controllers/controllers.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/lab/store/json_path.h"
#include "spdlog/spdlog.h"

namespace sluice::lab {

using nlohmann::json;

namespace {

constexpr char kManagedBy[] = "endpointslice.kubernetes.io/managed-by";
constexpr char kControllerName[] = "endpointslice-controller.k8s.io";
constexpr char kServiceNameLabel[] = "kubernetes.io/service-name";

const json& Field(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

absl::Status Invalid(const json& svc, const std::string& field, const std::string& detail) {
  return absl::InvalidArgumentError(absl::StrCat("Service \"", JsonStr(svc, {"metadata", "name"}),
                                                 "\" is invalid: ", field, ": ", detail));
}

bool PodReady(const json& pod) {
  for (const json& c : Field(Field(pod, "status"), "conditions").is_array()
                           ? Field(Field(pod, "status"), "conditions")
                           : json::array()) {
    if (JsonStr(c, {"type"}) == "Ready") return JsonStr(c, {"status"}) == "True";
  }
  return false;
}

// The slice port for `svc_port` on `pod`, or nullopt when a named targetPort is not declared by
// any of the pod's containers.
std::optional<json> ResolvePort(const json& svc_port, const json& pod) {
  std::string protocol = svc_port.value("protocol", "TCP");
  const json& target = Field(svc_port, "targetPort");
  int64_t number = 0;
  if (target.is_number_integer()) {
    number = target.get<int64_t>();
  } else if (target.is_string()) {
    std::string name = target.get<std::string>();
    if (absl::SimpleAtoi(name, &number)) {
      // an int-or-string given as a decimal string
    } else {
      const json& containers = Field(Field(pod, "spec"), "containers");
      bool found = false;
      if (containers.is_array()) {
        for (const json& c : containers) {
          const json& ports = Field(c, "ports");
          if (!ports.is_array()) continue;
          for (const json& p : ports) {
            if (p.value("name", "") == name && p.value("protocol", "TCP") == protocol &&
                p.contains("containerPort")) {
              number = p["containerPort"].get<int64_t>();
              found = true;
              break;
            }
          }
          if (found) break;
        }
      }
      if (!found) return std::nullopt;
    }
  } else {
    number = svc_port.value("port", int64_t{0});
  }
  json out = {{"name", svc_port.value("name", "")}, {"port", number}, {"protocol", protocol}};
  if (svc_port.contains("appProtocol")) out["appProtocol"] = svc_port["appProtocol"];
  return out;
}

}  // namespace

absl::StatusOr<std::pair<uint32_t, int>> ParseIpv4Cidr(std::string_view cidr) {
  std::vector<std::string> parts = absl::StrSplit(std::string(cidr), '/');
  int prefix = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &prefix) || prefix < 0 || prefix > 32) {
    return absl::InvalidArgumentError(absl::StrCat("bad CIDR ", std::string(cidr)));
  }
  auto ip = ParseIpv4(parts[0]);
  if (!ip.ok()) return ip.status();
  uint32_t mask = prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
  return std::make_pair(*ip & mask, prefix);
}

absl::StatusOr<uint32_t> ParseIpv4(std::string_view text) {
  std::vector<std::string> octets = absl::StrSplit(std::string(text), '.');
  if (octets.size() != 4) return absl::InvalidArgumentError("not an IPv4 address");
  uint32_t ip = 0;
  for (const std::string& o : octets) {
    int v = 0;
    if (!absl::SimpleAtoi(o, &v) || v < 0 || v > 255) {
      return absl::InvalidArgumentError("not an IPv4 address");
    }
    ip = ip << 8 | static_cast<uint32_t>(v);
  }
  return ip;
}

std::string FormatIpv4(uint32_t ip) {
  return absl::StrCat(ip >> 24, ".", (ip >> 16) & 255, ".", (ip >> 8) & 255, ".", ip & 255);
}

// ---- ServiceAdmission ----------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ServiceAdmission>> ServiceAdmission::Create(
    const ControllerOptions& options) {
  auto cidr = ParseIpv4Cidr(options.service_cidr);
  if (!cidr.ok()) return cidr.status();
  if (cidr->second > 28) return absl::InvalidArgumentError("service CIDR too small");
  return std::unique_ptr<ServiceAdmission>(
      new ServiceAdmission(options, cidr->first, cidr->second));
}

ServiceAdmission::ServiceAdmission(const ControllerOptions& options, uint32_t network, int prefix)
    : options_(options),
      network_(network),
      size_(prefix == 0 ? 0 : uint32_t{1} << (32 - prefix)),
      port_cursor_(options.node_port_min) {
  // Dynamic allocations start above a static band (like kube-apiserver), so well-known static
  // IPs such as the DNS service's .10 stay free.
  ip_cursor_ = std::clamp<uint32_t>(size_ / 16, 2, 256);
}

absl::Status ServiceAdmission::Admit(const ResourceType& type, json& object, const json* old) {
  if (type.plural != "services") return absl::OkStatus();
  return AdmitService(object, old);
}

absl::Status ServiceAdmission::AdmitService(json& svc, const json* old) {
  json& spec = svc["spec"];
  if (!spec.is_object()) spec = json::object();
  std::string type = spec.value("type", "");
  if (type.empty()) spec["type"] = type = "ClusterIP";
  if (type != "ClusterIP" && type != "NodePort" && type != "LoadBalancer" &&
      type != "ExternalName") {
    return Invalid(svc, "spec.type", absl::StrCat("Unsupported value: \"", type, "\""));
  }
  bool external_name = type == "ExternalName";
  if (!spec.contains("sessionAffinity")) spec["sessionAffinity"] = "None";
  if (!external_name) {
    if (!spec.contains("internalTrafficPolicy")) spec["internalTrafficPolicy"] = "Cluster";
    if (!spec.contains("ipFamilies")) spec["ipFamilies"] = json::array({"IPv4"});
    if (!spec.contains("ipFamilyPolicy")) spec["ipFamilyPolicy"] = "SingleStack";
  }
  bool node_ports = type == "NodePort" || type == "LoadBalancer";
  if (type == "LoadBalancer" && spec.value("allocateLoadBalancerNodePorts", true) == false) {
    node_ports = false;
  }
  if ((type == "NodePort" || type == "LoadBalancer") && !spec.contains("externalTrafficPolicy")) {
    spec["externalTrafficPolicy"] = "Cluster";
  }
  if (!spec["ports"].is_array()) spec["ports"] = json::array();
  for (json& p : spec["ports"]) {
    if (!p.contains("protocol")) p["protocol"] = "TCP";
    if (!p.contains("port") || !p["port"].is_number_integer()) {
      return Invalid(svc, "spec.ports[].port", "Required value");
    }
    if (!p.contains("targetPort")) p["targetPort"] = p["port"];
  }
  const json* old_spec = old != nullptr ? &Field(*old, "spec") : nullptr;

  // ClusterIP.
  std::optional<uint32_t> allocate_ip;  // offset to mark used
  std::optional<uint32_t> release_ip;
  std::string old_ip = old_spec != nullptr ? JsonStr(*old_spec, {"clusterIP"}) : "";
  std::string ip = spec.value("clusterIP", "");
  if (external_name) {
    spec.erase("clusterIP");
    spec.erase("clusterIPs");
    if (!old_ip.empty() && old_ip != "None") {
      if (auto v = ParseIpv4(old_ip); v.ok()) release_ip = *v - network_;
    }
  } else if (!old_ip.empty() && (ip.empty() || ip == old_ip)) {
    spec["clusterIP"] = old_ip;
  } else if (!old_ip.empty() && ip != old_ip) {
    return Invalid(svc, "spec.clusterIPs[0]",
                   absl::StrCat("Invalid value: \"", ip, "\": field is immutable"));
  } else if (ip == "None") {
    // headless
  } else if (ip.empty()) {
    bool found = false;
    for (uint32_t i = 0; i < size_; ++i) {
      uint32_t off = ip_cursor_ + i;
      if (off >= size_ - 1) off = 2 + (off - (size_ - 1)) % (size_ - 3);
      if (off < 2 || used_ips_.contains(off)) continue;
      allocate_ip = off;
      ip_cursor_ = off + 1;
      found = true;
      break;
    }
    if (!found) {
      return Invalid(svc, "spec.clusterIPs",
                     "Internal error: failed to allocate a serviceIP: range is full");
    }
    spec["clusterIP"] = FormatIpv4(network_ + *allocate_ip);
  } else {
    auto v = ParseIpv4(ip);
    if (!v.ok()) {
      return Invalid(svc, "spec.clusterIPs[0]",
                     absl::StrCat("Invalid value: \"", ip, "\": must be a valid IP address"));
    }
    uint32_t off = *v - network_;
    if (*v < network_ || off >= size_ || off == 0 || off == size_ - 1) {
      return Invalid(svc, "spec.clusterIPs",
                     absl::StrCat("Invalid value: [\"", ip, "\"]: failed to allocate IP ", ip,
                                  ": the provided IP (", ip,
                                  ") is not in the valid range. The range of valid IPs is ",
                                  options_.service_cidr));
    }
    if (used_ips_.contains(off)) {
      return Invalid(svc, "spec.clusterIPs",
                     absl::StrCat("Invalid value: [\"", ip, "\"]: failed to allocate IP ", ip,
                                  ": provided IP is already allocated"));
    }
    allocate_ip = off;
  }
  if (!external_name) spec["clusterIPs"] = json::array({spec["clusterIP"]});

  // NodePorts.
  std::set<int> old_ports;
  if (old_spec != nullptr && Field(*old_spec, "ports").is_array()) {
    for (const json& p : (*old_spec)["ports"]) {
      if (p.value("nodePort", 0) != 0) old_ports.insert(p["nodePort"].get<int>());
    }
  }
  if (old_spec != nullptr && old_spec->value("healthCheckNodePort", 0) != 0) {
    old_ports.insert((*old_spec)["healthCheckNodePort"].get<int>());
  }
  std::set<int> new_ports;
  int cursor = port_cursor_;
  auto take = [&](int want, const std::string& field) -> absl::StatusOr<int> {
    if (want != 0) {
      if (want < options_.node_port_min || want > options_.node_port_max) {
        return Invalid(svc, field,
                       absl::StrCat("Invalid value: ", want,
                                    ": provided port is not in the valid range. The range of "
                                    "valid ports is ",
                                    options_.node_port_min, "-", options_.node_port_max));
      }
      if (new_ports.contains(want) ||
          (used_node_ports_.contains(want) && !old_ports.contains(want))) {
        return Invalid(
            svc, field,
            absl::StrCat("Invalid value: ", want, ": provided port is already allocated"));
      }
      new_ports.insert(want);
      return want;
    }
    int range = options_.node_port_max - options_.node_port_min + 1;
    for (int i = 0; i < range; ++i) {
      int port = options_.node_port_min + (cursor - options_.node_port_min + i) % range;
      if (new_ports.contains(port) || used_node_ports_.contains(port) || old_ports.contains(port)) {
        continue;
      }
      new_ports.insert(port);
      cursor = port + 1;
      return port;
    }
    return Invalid(svc, field, "Internal error: range is full");
  };
  int index = 0;
  for (json& p : spec["ports"]) {
    std::string field = absl::StrCat("spec.ports[", index++, "].nodePort");
    if (!node_ports) {
      p.erase("nodePort");
      continue;
    }
    int want = p.value("nodePort", 0);
    if (want == 0 && old_spec != nullptr && Field(*old_spec, "ports").is_array()) {
      for (const json& op : (*old_spec)["ports"]) {
        if (op.value("port", 0) == p["port"].get<int>() &&
            op.value("protocol", "TCP") == p["protocol"].get<std::string>()) {
          want = op.value("nodePort", 0);
        }
      }
    }
    // The same nodePort may serve TCP and UDP of one port number.
    bool shared = false;
    if (want != 0 && new_ports.contains(want)) {
      for (const json& q : spec["ports"]) {
        if (&q == &p) break;
        if (q.value("nodePort", 0) == want && q.value("protocol", "TCP") != p["protocol"]) {
          shared = true;
        }
      }
    }
    if (shared) continue;
    auto got = take(want, field);
    if (!got.ok()) return got.status();
    p["nodePort"] = *got;
  }
  if (type == "LoadBalancer" && spec.value("externalTrafficPolicy", "") == "Local") {
    int want = spec.value("healthCheckNodePort", 0);
    if (want == 0 && old_spec != nullptr) want = old_spec->value("healthCheckNodePort", 0);
    auto got = take(want, "spec.healthCheckNodePort");
    if (!got.ok()) return got.status();
    spec["healthCheckNodePort"] = *got;
  } else {
    spec.erase("healthCheckNodePort");
  }

  // Commit.
  if (allocate_ip) used_ips_.insert(*allocate_ip);
  if (release_ip) used_ips_.erase(*release_ip);
  for (int p : old_ports) {
    if (!new_ports.contains(p)) used_node_ports_.erase(p);
  }
  used_node_ports_.insert(new_ports.begin(), new_ports.end());
  port_cursor_ = cursor;
  return absl::OkStatus();
}

void ServiceAdmission::Deleted(const ResourceType& type, const json& object) {
  if (type.plural != "services") return;
  const json& spec = Field(object, "spec");
  std::string ip = JsonStr(spec, {"clusterIP"});
  if (auto v = ParseIpv4(ip); v.ok()) used_ips_.erase(*v - network_);
  if (Field(spec, "ports").is_array()) {
    for (const json& p : spec["ports"]) used_node_ports_.erase(p.value("nodePort", 0));
  }
  used_node_ports_.erase(spec.value("healthCheckNodePort", 0));
}

// ---- EndpointSlices ------------------------------------------------------------------------

std::vector<json> DesiredEndpointSlices(const json& service, const std::vector<json>& pods) {
  const json& spec = Field(service, "spec");
  const json& md = Field(service, "metadata");
  std::string name = JsonStr(md, {"name"});
  std::string ns = JsonStr(md, {"namespace"});
  bool publish_not_ready = spec.value("publishNotReadyAddresses", false);
  const json& svc_ports = Field(spec, "ports").is_array() ? spec["ports"] : json::array();

  std::map<std::string, std::pair<json, json>> groups;  // ports dump -> (ports, endpoints)
  std::vector<const json*> sorted;
  for (const json& pod : pods) sorted.push_back(&pod);
  std::sort(sorted.begin(), sorted.end(), [](const json* a, const json* b) {
    return JsonStr(*a, {"metadata", "name"}) < JsonStr(*b, {"metadata", "name"});
  });
  for (const json* pod_ptr : sorted) {
    const json& pod = *pod_ptr;
    if (!SelectorMapMatches(Field(spec, "selector"), Field(Field(pod, "metadata"), "labels"))) {
      continue;
    }
    std::string ip = JsonStr(pod, {"status", "podIP"});
    std::string phase = JsonStr(pod, {"status", "phase"});
    if (ip.empty() || phase == "Succeeded" || phase == "Failed") continue;
    json ports = json::array();
    for (const json& sp : svc_ports) {
      if (auto p = ResolvePort(sp, pod)) ports.push_back(*p);
    }
    bool terminating = Field(pod, "metadata").contains("deletionTimestamp");
    bool serving = PodReady(pod) || publish_not_ready;
    json endpoint = {
        {"addresses", json::array({ip})},
        {"conditions",
         {{"ready", serving && !terminating}, {"serving", serving}, {"terminating", terminating}}},
        {"targetRef",
         {{"kind", "Pod"},
          {"namespace", ns},
          {"name", JsonStr(pod, {"metadata", "name"})},
          {"uid", JsonStr(pod, {"metadata", "uid"})}}},
    };
    if (publish_not_ready) endpoint["conditions"]["ready"] = true;
    std::string node = JsonStr(pod, {"spec", "nodeName"});
    if (!node.empty()) endpoint["nodeName"] = node;
    auto& group = groups[ports.dump()];
    if (group.first.is_null()) {
      group.first = ports;
      group.second = json::array();
    }
    group.second.push_back(std::move(endpoint));
  }
  if (groups.empty()) {
    // A placeholder: the Service exists but has no endpoints.
    json ports = json::array();
    for (const json& sp : svc_ports) {
      if (Field(sp, "targetPort").is_number_integer()) {
        json p = {{"name", sp.value("name", "")},
                  {"port", sp["targetPort"]},
                  {"protocol", sp.value("protocol", "TCP")}};
        if (sp.contains("appProtocol")) p["appProtocol"] = sp["appProtocol"];
        ports.push_back(p);
      }
    }
    groups[ports.dump()] = {ports, json::array()};
  }
  json labels = Field(md, "labels").is_object() ? md["labels"] : json::object();
  labels[kServiceNameLabel] = name;
  labels[kManagedBy] = kControllerName;
  if (JsonStr(spec, {"clusterIP"}) == "None") labels["service.kubernetes.io/headless"] = "";
  std::vector<json> slices;
  for (auto& [key, group] : groups) {
    slices.push_back({
        {"apiVersion", "discovery.k8s.io/v1"},
        {"kind", "EndpointSlice"},
        {"metadata",
         {{"namespace", ns},
          {"generateName", name + "-"},
          {"labels", labels},
          {"ownerReferences", json::array({{{"apiVersion", "v1"},
                                            {"kind", "Service"},
                                            {"name", name},
                                            {"uid", JsonStr(md, {"uid"})},
                                            {"controller", true},
                                            {"blockOwnerDeletion", true}}})}}},
        {"addressType", "IPv4"},
        {"endpoints", group.second},
        {"ports", group.first},
    });
  }
  return slices;
}

// ---- Controllers ---------------------------------------------------------------------------

Controllers::Controllers(ObjectStore* store, ControllerOptions options)
    : store_(store), options_(std::move(options)) {
  if (auto cidr = ParseIpv4Cidr(options_.cluster_cidr); cidr.ok()) {
    cluster_network_ = cidr->first;
    cluster_prefix_ = cidr->second;
  } else {
    spdlog::error("lab controllers: bad cluster CIDR {}", options_.cluster_cidr);
  }
  store_->AddListener([this](const Event& e) { OnEvent(e); });
}

Controllers::~Controllers() { Stop(); }

absl::Status Controllers::Start() {
  if (thread_.joinable()) return absl::FailedPreconditionError("controllers already running");
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
  }
  SyncAll();
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void Controllers::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Controllers::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

void Controllers::OnEvent(const Event& e) {
  const json& md = (*e.object)["metadata"];
  std::string ns = md.value("namespace", "");
  std::string name = md.value("name", "");
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string& plural = e.resource->plural;
    if (plural == "services") {
      dirty_services_.insert({ns, name});
    } else if (plural == "pods") {
      auto& sets = dirty_pods_[ns];
      sets.push_back(Field(md, "labels"));
      if (e.previous) sets.push_back(Field((*e.previous)["metadata"], "labels"));
    } else if (plural == "nodes") {
      if (e.type != EventType::kDeleted) dirty_nodes_.insert(name);
    } else if (plural == "endpointslices") {
      const json& labels = Field(md, "labels");
      if (JsonStr(labels, {kManagedBy}) == kControllerName) {
        dirty_services_.insert({ns, JsonStr(labels, {kServiceNameLabel})});
      }
    } else {
      return;
    }
  }
  cv_.notify_all();
}

void Controllers::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100), [this] {
      return stop_ || wake_ || !dirty_services_.empty() || !dirty_pods_.empty() ||
             !dirty_nodes_.empty();
    });
    if (stop_) break;
    wake_ = false;
    auto services = std::move(dirty_services_);
    auto pods = std::move(dirty_pods_);
    auto nodes = std::move(dirty_nodes_);
    dirty_services_.clear();
    dirty_pods_.clear();
    dirty_nodes_.clear();
    lock.unlock();
    for (const std::string& n : nodes) AllocatePodCidr(n);
    for (const auto& [ns, label_sets] : pods) SyncNamespacePods(ns, label_sets);
    for (const auto& [ns, name] : services) SyncService(ns, name);
    store_->RemoveExpiredTerminatingPods();
    lock.lock();
  }
}

void Controllers::SyncAll() {
  if (auto nodes = store_->List(Resource("nodes"), {}); nodes.ok()) {
    for (const ObjectPtr& n : nodes->items) AllocatePodCidr(JsonStr(*n, {"metadata", "name"}));
  }
  if (auto services = store_->List(Resource("services"), {}); services.ok()) {
    for (const ObjectPtr& s : services->items) {
      SyncService(JsonStr(*s, {"metadata", "namespace"}), JsonStr(*s, {"metadata", "name"}));
    }
  }
  store_->RemoveExpiredTerminatingPods();
}

void Controllers::SyncNamespacePods(const std::string& ns, const std::vector<json>& label_sets) {
  ListOptions opts;
  opts.namespace_name = ns;
  auto services = store_->List(Resource("services"), opts);
  if (!services.ok()) return;
  for (const ObjectPtr& s : services->items) {
    const json& selector = Field(Field(*s, "spec"), "selector");
    for (const json& labels : label_sets) {
      if (SelectorMapMatches(selector, labels)) {
        SyncService(ns, JsonStr(*s, {"metadata", "name"}));
        break;
      }
    }
  }
}

void Controllers::SyncService(const std::string& ns, const std::string& name) {
  const ResourceType& slices_type = Resource("endpointslices");
  ListOptions slice_opts;
  slice_opts.namespace_name = ns;
  auto selector = LabelSelector::Parse(
      absl::StrCat(kServiceNameLabel, "=", name, ",", kManagedBy, "=", kControllerName));
  if (!selector.ok()) return;  // a service name that is not a label value cannot have slices
  slice_opts.labels = *selector;
  auto existing = store_->List(slices_type, slice_opts);
  if (!existing.ok()) return;

  std::vector<json> desired;
  auto svc = store_->Get(Resource("services"), ns, name);
  if (svc.ok() && Field(Field(*svc, "spec"), "selector").is_object() &&
      !(*svc)["spec"]["selector"].empty() && JsonStr(*svc, {"spec", "type"}) != "ExternalName") {
    ListOptions pod_opts;
    pod_opts.namespace_name = ns;
    auto pods = store_->List(Resource("pods"), pod_opts);
    if (!pods.ok()) return;
    std::vector<json> pod_objects;
    for (const ObjectPtr& p : pods->items) {
      if (SelectorMapMatches((*svc)["spec"]["selector"], Field((*p)["metadata"], "labels"))) {
        pod_objects.push_back(*p);
      }
    }
    desired = DesiredEndpointSlices(*svc, pod_objects);
  }

  std::vector<bool> used(existing->items.size(), false);
  for (json& want : desired) {
    bool placed = false;
    for (size_t i = 0; i < existing->items.size() && !placed; ++i) {
      const json& have = *existing->items[i];
      if (used[i] || Field(have, "ports") != want["ports"]) continue;
      used[i] = true;
      placed = true;
      if (Field(have, "endpoints") == want["endpoints"] &&
          Field(have["metadata"], "labels") == want["metadata"]["labels"] &&
          Field(have["metadata"], "ownerReferences") == want["metadata"]["ownerReferences"]) {
        continue;
      }
      auto s = store_->Update(slices_type, ns, JsonStr(have, {"metadata", "name"}), [&](json& cur) {
        cur["endpoints"] = want["endpoints"];
        cur["metadata"]["labels"] = want["metadata"]["labels"];
        cur["metadata"]["ownerReferences"] = want["metadata"]["ownerReferences"];
        return absl::OkStatus();
      });
      if (!s.ok())
        spdlog::warn("lab endpointslices: update {}/{}: {}", ns, name, s.status().ToString());
    }
    if (!placed) {
      auto s = store_->Create(slices_type, want);
      if (!s.ok())
        spdlog::warn("lab endpointslices: create for {}/{}: {}", ns, name, s.status().ToString());
    }
  }
  for (size_t i = 0; i < existing->items.size(); ++i) {
    if (used[i]) continue;
    auto s =
        store_->Delete(slices_type, ns, JsonStr(*existing->items[i], {"metadata", "name"}), {});
    if (!s.ok() && !absl::IsNotFound(s.status())) {
      spdlog::warn("lab endpointslices: delete for {}/{}: {}", ns, name, s.status().ToString());
    }
  }
}

void Controllers::AllocatePodCidr(const std::string& node) {
  if (!options_.allocate_node_cidrs) return;
  auto obj = store_->Get(Resource("nodes"), "", node);
  if (!obj.ok() || !JsonStr(*obj, {"spec", "podCIDR"}).empty()) return;
  auto nodes = store_->List(Resource("nodes"), {});
  if (!nodes.ok()) return;
  std::set<uint32_t> used;
  for (const ObjectPtr& n : nodes->items) {
    if (auto c = ParseIpv4Cidr(JsonStr(*n, {"spec", "podCIDR"})); c.ok()) used.insert(c->first);
  }
  int bits = options_.node_cidr_mask - cluster_prefix_;
  if (bits < 0 || bits > 24) return;
  uint32_t count = uint32_t{1} << bits;
  uint32_t step = uint32_t{1} << (32 - options_.node_cidr_mask);
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t net = cluster_network_ + i * step;
    if (used.contains(net)) continue;
    std::string cidr = absl::StrCat(FormatIpv4(net), "/", options_.node_cidr_mask);
    auto s = store_->Update(Resource("nodes"), "", node, [&](json& n) {
      if (!JsonStr(n, {"spec", "podCIDR"}).empty()) return absl::OkStatus();
      n["spec"]["podCIDR"] = cidr;
      n["spec"]["podCIDRs"] = json::array({cidr});
      return absl::OkStatus();
    });
    if (!s.ok())
      spdlog::warn("lab node ipam: {}: {}", node, s.status().ToString());
    else
      spdlog::info("lab node ipam: {} gets {}", node, cidr);
    return;
  }
  spdlog::error("lab node ipam: cluster CIDR {} is full, {} gets no pod CIDR",
                options_.cluster_cidr, node);
}

absl::Status Controllers::Bootstrap(ObjectStore* store, const ControllerOptions& options,
                                    const std::string& apiserver_ip, int apiserver_port) {
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    auto s = store->Create(Resource("namespaces"), {{"metadata", {{"name", ns}}}});
    if (!s.ok() && !absl::IsAlreadyExists(s.status())) return s.status();
  }
  auto cidr = ParseIpv4Cidr(options.service_cidr);
  if (!cidr.ok()) return cidr.status();
  json svc = {{"metadata",
               {{"name", "kubernetes"},
                {"namespace", "default"},
                {"labels", {{"component", "apiserver"}, {"provider", "kubernetes"}}}}},
              {"spec",
               {{"type", "ClusterIP"},
                {"clusterIP", FormatIpv4(cidr->first + 1)},
                {"ports", json::array({{{"name", "https"},
                                        {"port", 443},
                                        {"protocol", "TCP"},
                                        {"targetPort", apiserver_port}}})}}}};
  auto created = store->Create(Resource("services"), svc);
  if (!created.ok() && !absl::IsAlreadyExists(created.status())) return created.status();
  if (!apiserver_ip.empty() && ParseIpv4(apiserver_ip).ok()) {
    json slice = {
        {"metadata",
         {{"name", "kubernetes"},
          {"namespace", "default"},
          {"labels",
           {{kServiceNameLabel, "kubernetes"},
            {kManagedBy, "endpointslicemirroring-controller.k8s.io"}}}}},
        {"addressType", "IPv4"},
        {"endpoints", json::array({{{"addresses", json::array({apiserver_ip})},
                                    {"conditions", {{"ready", true}}}}})},
        {"ports",
         json::array({{{"name", "https"}, {"port", apiserver_port}, {"protocol", "TCP"}}})}};
    auto s = store->Create(Resource("endpointslices"), slice);
    if (!s.ok() && !absl::IsAlreadyExists(s.status())) return s.status();
  }
  return absl::OkStatus();
}

}  // namespace sluice::lab
