#include "agent/service/sync.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/base/files.h"
#include "agent/metrics/registry.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

std::string SliceServiceKey(const k8s::EndpointSlice& s) {
  if (s.service_name.empty()) return "";
  return absl::StrCat(s.meta.namespace_, "/", s.service_name);
}

}  // namespace

ServiceSync::ServiceSync(k8s::Store<k8s::Service>& services, k8s::Store<k8s::EndpointSlice>& slices,
                         std::function<bool()> synced, ServiceReconciler& reconciler,
                         HealthCheckServers* health, NodeContext node, std::string state_dir,
                         const Clock* clock)
    : clock_(clock),
      services_(services),
      slices_(slices),
      reconciler_(reconciler),
      health_(health),
      node_(std::move(node)),
      names_(state_dir),
      state_dir_(std::move(state_dir)) {
  // Slices listed before the listener is added (a stale key is harmless: Translate skips it).
  {
    absl::MutexLock l(&index_->mu);
    for (const auto& s : slices_.List()) {
      std::string svc = SliceServiceKey(*s);
      if (!svc.empty()) index_->by_service[svc].insert(s->meta.Key());
    }
  }
  controller::ControllerOptions options;
  options.name = "services";
  options.synced = std::move(synced);
  options.clock = clock_;
  // A full pass covers the Services in the store and those the maps still hold (restored from
  // the pins after a restart; gone from the API while the agent was down).
  options.all_keys = [this] {
    std::vector<std::string> keys;
    for (const auto& s : services_.List()) keys.push_back(s->meta.Key());
    for (const std::string& s : reconciler_.Services()) keys.push_back(s);
    return keys;
  };
  controller_ = std::make_unique<controller::Controller>(
      std::move(options), [this](const controller::Batch& b) { return Reconcile(b); });

  services_.AddListener([keys = controller_->keys()](const k8s::Change<k8s::Service>& c) {
    const auto& obj = c.new_obj ? c.new_obj : c.old_obj;
    keys->Mark(obj->meta.Key());
  });
  slices_.AddListener([keys = controller_->keys(),
                       index = index_](const k8s::Change<k8s::EndpointSlice>& c) {
    std::vector<std::string> dirty;
    {
      absl::MutexLock l(&index->mu);
      if (c.old_obj) {
        std::string svc = SliceServiceKey(*c.old_obj);
        auto it = index->by_service.find(svc);
        if (it != index->by_service.end()) {
          it->second.erase(c.old_obj->meta.Key());
          if (it->second.empty()) index->by_service.erase(it);
        }
        if (!svc.empty()) dirty.push_back(std::move(svc));
      }
      if (c.new_obj) {
        std::string svc = SliceServiceKey(*c.new_obj);
        if (!svc.empty()) {
          index->by_service[svc].insert(c.new_obj->meta.Key());
          dirty.push_back(std::move(svc));
        }
      }
    }
    for (std::string& svc : dirty) keys->Mark(std::move(svc));
  });
  metrics_ = std::make_unique<metrics::ScopedCollector>(
      metrics::Default(), metrics::Default().AddCollector([this](metrics::ScrapeSink& out) {
        absl::MutexLock l(&unprogrammed_mu_);
        for (const auto& [map, c] : unprogrammed_) {
          out.Gauge("sluice_services_unprogrammed",
                    "Service frontends not programmed because a Service map has no room for "
                    "them, by the map that is full",
                    {{"reason", "map_full"}, {"map_name", map}}, static_cast<double>(c.refused));
          out.Gauge("sluice_services_truncated",
                    "Service frontends programmed with fewer backends than the Service has "
                    "because a Service map has no room for more, by the map that is full",
                    {{"reason", "map_full"}, {"map_name", map}}, static_cast<double>(c.truncated));
        }
        const ServiceReconcilerStats& st = reconciler_stats_;
        out.Counter("sluice_service_udp_flows_flushed_total",
                    "UDP conntrack entries deleted because their backend left its Service",
                    {}, static_cast<double>(st.ct_flushed));
        out.Counter("sluice_service_udp_sockets_closed_total",
                    "Connected UDP sockets of the node closed (SOCK_DESTROY) because the backend "
                    "socket LB gave them left its Service",
                    {}, static_cast<double>(st.udp_sockets_closed));
        out.Counter("sluice_service_udp_socket_close_failures_total",
                    "Closes of such sockets that failed (a kernel without SOCK_DESTROY): the "
                    "socket keeps its backend",
                    {}, static_cast<double>(st.udp_socket_close_failures));
        out.Counter("sluice_service_map_errors_total",
                    "Service map writes, deletes and flushes that failed (retried with the "
                    "Service)",
                    {}, static_cast<double>(st.errors));
      }));
}

void ServiceSync::PublishUnprogrammed() {
  // The list is bounded: with a whole cluster's worth refused the counts say the rest.
  constexpr size_t kMaxListed = 10000;
  size_t total = 0;
  std::vector<UnprogrammedFrontend> listed = reconciler_.Unprogrammed(kMaxListed, &total);
  nlohmann::json list = nlohmann::json::array();
  for (const UnprogrammedFrontend& u : listed) {
    nlohmann::json e = {
        {"service", u.service},         {"frontend", absl::StrCat(u.addr.ToString(), ":", u.port)},
        {"protocol", u.proto},          {"scope", u.scope},
        {"reason", "map_full"},         {"map", u.map},
        {"backends", u.backends_wanted}};
    if (u.truncated) e["backendsProgrammed"] = u.backends_programmed;
    list.push_back(std::move(e));
  }
  nlohmann::json doc = {{"total", total}, {"frontends", std::move(list)}};
  std::string json = doc.dump(1) + "\n";
  bool changed;
  {
    absl::MutexLock l(&unprogrammed_mu_);
    unprogrammed_ = reconciler_.UnprogrammedByMap();
    reconciler_stats_ = reconciler_.stats();
    changed = json != unprogrammed_json_;
    unprogrammed_json_ = json;
  }
  if ((changed || !unprogrammed_written_) && !state_dir_.empty()) {
    absl::Status st = WriteFileAtomically(state_dir_, kServiceUnprogrammedFile, json, 0600);
    unprogrammed_written_ = st.ok();
    if (!st.ok()) {
      spdlog::warn("services: unprogrammed frontends for sluicectl not saved: {}", st.ToString());
    }
  }
}

std::optional<ServiceTranslation> ServiceSync::Translate(const std::string& service) {
  k8s::Store<k8s::Service>::Ptr svc = services_.Get(service);
  if (svc == nullptr) return std::nullopt;
  std::set<std::string> keys;
  {
    absl::MutexLock l(&index_->mu);
    auto it = index_->by_service.find(service);
    if (it != index_->by_service.end()) keys = it->second;
  }
  std::vector<std::shared_ptr<const k8s::EndpointSlice>> slices;
  for (const std::string& k : keys) {
    if (auto s = slices_.Get(k); s != nullptr) slices.push_back(std::move(s));
  }
  return TranslateService(*svc, slices, node_);
}

absl::Status ServiceSync::Reconcile(const controller::Batch& batch) {
  const uint64_t removed_before = reconciler_.FrontendsRemoved();
  absl::Time start = clock_->Now();
  std::vector<std::pair<std::string, std::optional<ServiceTranslation>>> changes;
  changes.reserve(batch.keys.size());
  for (const std::string& key : batch.keys) {
    std::optional<ServiceTranslation> t = Translate(key);
    if (t) {
      refusals_.Record(key, t->refused);
    } else {
      refusals_.Forget(key);
    }
    changes.emplace_back(key, std::move(t));
  }
  absl::Duration translated = clock_->Now() - start;
  absl::Status st = reconciler_.ApplyAll(changes);
  if (st.ok() && batch.full) st = reconciler_.PruneStale();
  // Names for sluicectl with the agent down. A batch of endpoint changes leaves them as they
  // were and writes nothing; a failed write is retried with the next batch.
  for (const std::string& key : batch.keys) {
    k8s::Store<k8s::Service>::Ptr svc = services_.Get(key);
    names_.Set(key, svc.get());
  }
  if (absl::Status w = names_.Flush(); !w.ok()) {
    spdlog::warn("services: Service names for sluicectl not saved: {}", w.ToString());
  }
  PublishUnprogrammed();
  if (health_ != nullptr) {
    for (const auto& [key, t] : changes) {
      health_->Update(key, t ? t->health_check : std::nullopt);
    }
  }
  absl::Duration took = clock_->Now() - start;
  if (spdlog::should_log(spdlog::level::debug)) {
    ServiceReconcilerStats stats = reconciler_.stats();
    spdlog::debug(
        "services: applied {} in {:.3f} ms (translate {:.3f} ms); {} frontends, {} backends, "
        "{} writes, {} deletes, {} UDP flows flushed",
        changes.size(), absl::ToDoubleMilliseconds(took), absl::ToDoubleMilliseconds(translated),
        stats.frontends, stats.backends, stats.map_updates, stats.map_deletes, stats.ct_flushed);
  }
  // A removed frontend may free a key another Service was refused: let that one try again.
  if (reconciler_.FrontendsRemoved() != removed_before) {
    for (const std::string& s : reconciler_.BlockedServices()) {
      if (!batch.keys.contains(s)) controller_->Mark(s);
    }
  }
  if (st.ok() && batch.full) {
    spdlog::info("services: {} Services programmed after the first full sync", changes.size());
#if defined(__GLIBC__)
    // The lists and the first pass leave the reflectors' and this thread's malloc arenas full of
    // freed decode and translation buffers that glibc keeps mapped: give them back once, now
    // (at 10k Services x 10 endpoints a few ms, tens of MiB of RSS; bench/README.md section 7).
    changes.clear();
    changes.shrink_to_fit();
    malloc_trim(0);
#endif
  }
  return st;
}

}  // namespace sluice::agent
