#include "agent/operator/operator.h"

#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/k8s/http_client.h"
#include "agent/k8s/model.h"
#include "agent/k8s/reflector.h"
#include "agent/k8s/store.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

using nlohmann::json;

struct NodeRecord {
  std::string pod_cidr;
  std::string resource_version;
};

// The Node list, fresh from the apiserver (not the watch cache).
absl::StatusOr<std::map<std::string, NodeRecord>> ListNodes(k8s::HttpClient* http) {
  k8s::HttpRequest req;
  req.path = "/api/v1/nodes";
  req.timeout = absl::Seconds(30);
  std::string body;
  k8s::HttpResult r = http->Get(req, [&](std::string_view s) {
    body.append(s);
    return true;
  });
  if (!r.ok()) return absl::UnavailableError(absl::StrCat("list nodes: ", r.Describe()));
  json list = json::parse(body, nullptr, false);
  if (!list.is_object() || !list.value("items", json()).is_array()) {
    return absl::DataLossError("list nodes: not a NodeList");
  }
  std::map<std::string, NodeRecord> out;
  for (const json& item : list["items"]) {
    const json meta = item.value("metadata", json::object());
    const json spec = item.value("spec", json::object());
    NodeRecord rec;
    rec.resource_version = meta.value("resourceVersion", "");
    if (spec.contains("podCIDR") && spec["podCIDR"].is_string()) {
      rec.pod_cidr = spec["podCIDR"].get<std::string>();
    } else if (spec.contains("podCIDRs") && spec["podCIDRs"].is_array() &&
               !spec["podCIDRs"].empty() && spec["podCIDRs"][0].is_string()) {
      rec.pod_cidr = spec["podCIDRs"][0].get<std::string>();
    }
    out[meta.value("name", "")] = std::move(rec);
  }
  out.erase("");
  return out;
}

}  // namespace

Operator::Operator(k8s::HttpClient* http, OperatorOptions options)
    : http_(http),
      options_(std::move(options)),
      lease_client_(NewKubernetesLeaseClient(http, options_.lease_namespace, options_.lease_name)),
      elector_(lease_client_.get(), options_.election) {}

Operator::~Operator() { Stop(release_.load()); }

void Operator::Start() {
  election_thread_ = std::thread([this] { ElectionLoop(); });
}

void Operator::Stop(bool release) {
  release_ = release && options_.release_on_stop;
  std::lock_guard<std::mutex> lock(stop_mu_);  // Stop may race with itself (signal, exit path)
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (election_thread_.joinable()) election_thread_.join();
}

LeaderElector::State Operator::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return final_state_;
}

OperatorCounters Operator::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

bool Operator::election_ended() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

std::string Operator::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

void Operator::ElectionLoop() {
  LeaderElector::State s = elector_.Run(stop_, [this] { StartLeading(); });
  StopLeading();
  if (s == LeaderElector::State::kLeader && release_.load()) {
    if (absl::Status r = elector_.Release(); !r.ok()) {
      spdlog::warn("sluice-operator: releasing the lease: {}", r.ToString());
    } else {
      spdlog::info("sluice-operator: released the lease");
    }
  }
  absl::MutexLock lock(&mu_);
  final_state_ = s;
  done_ = true;
}

void Operator::StartLeading() {
  spdlog::info(
      "sluice-operator: leading; allocating node CIDRs from {} (/{})",
      absl::StrJoin(options_.pool.pools, ",",
                    [](std::string* out, const IpPrefix& p) { out->append(p.ToString()); }),
      options_.pool.mask_size);
  leading_ = true;
  // The watch only says when to run a round; the round itself lists afresh.
  nodes_ = std::make_unique<k8s::Store<k8s::Node>>();
  nodes_->AddListener([this](const k8s::Change<k8s::Node>&) { Poke(); });
  reflector_ = k8s::MakeReflector(http_, nodes_.get(), k8s::ReflectorOptions{});
  reflector_->Start();
  allocate_thread_ = std::thread([this] { AllocateLoop(); });
}

void Operator::StopLeading() {
  if (!leading_.exchange(false)) return;
  allocate_stop_.Notify();
  {
    absl::MutexLock lock(&mu_);
    dirty_ = true;  // wakes the loop
  }
  if (allocate_thread_.joinable()) allocate_thread_.join();
  if (reflector_) reflector_->Stop();
}

void Operator::Poke() {
  absl::MutexLock lock(&mu_);
  dirty_ = true;
}

void Operator::AllocateLoop() {
  while (!allocate_stop_.HasBeenNotified()) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&dirty_),
                           retry_soon_ ? options_.election.retry_period : options_.resync);
      dirty_ = false;
      retry_soon_ = false;
    }
    if (allocate_stop_.HasBeenNotified() || !leading_.load()) break;
    AllocateRound();
  }
}

void Operator::AllocateRound() {
  auto nodes = ListNodes(http_);
  if (!nodes.ok()) {
    spdlog::warn("sluice-operator: {}", nodes.status().ToString());
    absl::MutexLock lock(&mu_);
    ++counters_.patch_errors;
    last_error_ = std::string(nodes.status().message());
    retry_soon_ = true;
    return;
  }
  std::map<std::string, std::string> current;
  for (const auto& [name, rec] : *nodes) current[name] = rec.pod_cidr;
  PoolAllocation a = AllocateNodeCidrs(options_.pool, current);

  uint64_t patched = 0, conflicts = 0, errors = 0;
  for (const auto& [name, cidr] : a.assign) {
    if (!leading_.load() || allocate_stop_.HasBeenNotified()) break;  // never write unelected
    const std::string c = cidr.ToString();
    json patch = {{"metadata", {{"resourceVersion", (*nodes)[name].resource_version}}},
                  {"spec", {{"podCIDR", c}, {"podCIDRs", json::array({c})}}}};
    k8s::HttpRequest req;
    req.method = "PATCH";
    req.path = absl::StrCat("/api/v1/nodes/", name);
    req.body = patch.dump();
    req.content_type = "application/merge-patch+json";
    req.timeout = absl::Seconds(10);
    k8s::HttpResult r = http_->Send(req, nullptr);
    if (r.ok()) {
      ++patched;
      spdlog::info("sluice-operator: node {} gets pod CIDR {}", name, c);
    } else if (r.status == 409) {
      ++conflicts;
      spdlog::info("sluice-operator: node {} changed since the list; retrying", name);
    } else {
      ++errors;
      spdlog::warn("sluice-operator: patch node {} with pod CIDR {}: {}", name, c, r.Describe());
    }
  }
  absl::MutexLock lock(&mu_);
  last_error_.clear();
  ++counters_.rounds;
  counters_.patched += patched;
  counters_.patch_conflicts += conflicts;
  counters_.patch_errors += errors;
  counters_.exhausted_nodes = a.exhausted.size();
  counters_.foreign_nodes = a.foreign.size();
  counters_.free_cidrs = a.free_after;
  if (a.exhausted != last_exhausted_) {
    if (!a.exhausted.empty()) {
      spdlog::error(
          "sluice-operator: the cluster pool is exhausted: {} node(s) without a pod "
          "CIDR: {}",
          a.exhausted.size(), absl::StrJoin(a.exhausted, ", "));
    }
    last_exhausted_ = a.exhausted;
  }
  if (conflicts > 0) dirty_ = true;  // redo at once from a fresh list
  if (errors > 0) retry_soon_ = true;
}

}  // namespace sluice::agent
