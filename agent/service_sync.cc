#include "agent/service_sync.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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
                         HealthCheckServers* health, NodeContext node)
    : services_(services),
      slices_(slices),
      synced_(std::move(synced)),
      reconciler_(reconciler),
      health_(health),
      node_(std::move(node)) {
  services_.AddListener([sh = sh_](const k8s::Change<k8s::Service>& c) {
    const auto& obj = c.new_obj ? c.new_obj : c.old_obj;
    absl::MutexLock l(&sh->mu);
    sh->MarkDirty(obj->meta.Key());
  });
  slices_.AddListener([sh = sh_](const k8s::Change<k8s::EndpointSlice>& c) {
    absl::MutexLock l(&sh->mu);
    if (c.old_obj) {
      std::string svc = SliceServiceKey(*c.old_obj);
      auto it = sh->slices_by_service.find(svc);
      if (it != sh->slices_by_service.end()) {
        it->second.erase(c.old_obj->meta.Key());
        if (it->second.empty()) sh->slices_by_service.erase(it);
      }
      if (!svc.empty()) sh->MarkDirty(svc);
    }
    if (c.new_obj) {
      std::string svc = SliceServiceKey(*c.new_obj);
      if (!svc.empty()) {
        sh->slices_by_service[svc].insert(c.new_obj->meta.Key());
        sh->MarkDirty(svc);
      }
    }
  });
  // Slices listed before the listener was added (a stale key is harmless: Translate skips it).
  {
    absl::MutexLock l(&sh_->mu);
    for (const auto& s : slices_.List()) {
      std::string svc = SliceServiceKey(*s);
      if (!svc.empty()) sh_->slices_by_service[svc].insert(s->meta.Key());
    }
  }
  thread_ = std::thread([this] { Run(); });
}

ServiceSync::~ServiceSync() {
  {
    absl::MutexLock l(&sh_->mu);
    sh_->stop = true;
  }
  thread_.join();
}

bool ServiceSync::WaitIdle(absl::Duration timeout) {
  Shared* sh = sh_.get();
  absl::MutexLock l(&sh->mu);
  auto idle = [sh]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh->mu) {
    return sh->applied == sh->seen && sh->dirty.empty() && !sh->retry && sh->pruned;
  };
  return sh->mu.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

bool ServiceSync::pruned() const {
  absl::MutexLock l(&sh_->mu);
  return sh_->pruned;
}

uint64_t ServiceSync::applies() const {
  absl::MutexLock l(&sh_->mu);
  return sh_->applies;
}

std::optional<ServiceTranslation> ServiceSync::Translate(const std::string& service) {
  k8s::Store<k8s::Service>::Ptr svc = services_.Get(service);
  if (svc == nullptr) return std::nullopt;
  std::set<std::string> keys;
  {
    absl::MutexLock l(&sh_->mu);
    auto it = sh_->slices_by_service.find(service);
    if (it != sh_->slices_by_service.end()) keys = it->second;
  }
  std::vector<std::shared_ptr<const k8s::EndpointSlice>> slices;
  for (const std::string& k : keys) {
    if (auto s = slices_.Get(k); s != nullptr) slices.push_back(std::move(s));
  }
  return TranslateService(*svc, slices, node_);
}

void ServiceSync::Run() {
  Shared* sh = sh_.get();
  while (true) {
    absl::flat_hash_set<std::string> batch;
    uint64_t gen = 0;
    bool first = false;
    // Asked outside sh->mu: the gate has a lock of its own.
    const bool synced_before = synced_();
    {
      absl::MutexLock l(&sh->mu);
      auto ready = [sh, synced_before]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh->mu) {
        return sh->stop || (synced_before && !sh->retry && !sh->dirty.empty());
      };
      // Wakes on a change or stop; the timeout notices the first full sync (and ends back-off).
      // Changes seen before the sync do not wake it: they wait for the sync, checked every 10 ms.
      sh->mu.AwaitWithTimeout(absl::Condition(&ready),
                              !synced_before ? absl::Milliseconds(10)
                              : sh->retry    ? absl::Seconds(1)
                                             : absl::Milliseconds(100));
      if (sh->stop) return;
      sh->retry = false;
      // Before every watch has listed, a Service may be seen without its EndpointSlices: apply
      // nothing (the maps keep serving what the last run programmed).
      if (!synced_()) continue;
      if (!sh->pruned) {
        first = true;
        for (const auto& s : services_.List()) sh->MarkDirty(s->meta.Key());
        for (const std::string& s : reconciler_.Services()) sh->MarkDirty(s);
      }
      if (sh->dirty.empty()) {
        sh->applied = sh->seen;
        continue;
      }
      batch.swap(sh->dirty);
      gen = sh->seen;
    }
    const uint64_t removed_before = reconciler_.FrontendsRemoved();
    absl::Time start = absl::Now();
    std::vector<std::pair<std::string, std::optional<ServiceTranslation>>> changes;
    changes.reserve(batch.size());
    for (const std::string& key : batch) changes.emplace_back(key, Translate(key));
    absl::Duration translated = absl::Now() - start;
    absl::Status st = reconciler_.ApplyAll(changes);
    if (st.ok() && first) st = reconciler_.PruneStale();
    if (health_ != nullptr) {
      for (const auto& [key, t] : changes) {
        health_->Update(key, t ? t->health_check : std::nullopt);
      }
    }
    absl::Duration took = absl::Now() - start;
    if (spdlog::should_log(spdlog::level::debug)) {
      ServiceReconcilerStats stats = reconciler_.stats();
      spdlog::debug(
          "services: applied {} in {:.3f} ms (translate {:.3f} ms); {} frontends, {} backends, "
          "{} writes, {} deletes, {} UDP flows flushed",
          changes.size(), absl::ToDoubleMilliseconds(took), absl::ToDoubleMilliseconds(translated),
          stats.frontends, stats.backends, stats.map_updates, stats.map_deletes, stats.ct_flushed);
    }
    const uint64_t removed_after = reconciler_.FrontendsRemoved();
    absl::MutexLock l(&sh->mu);
    sh->applies += changes.size();
    // A removed frontend may free a key another Service was refused: let that one try again.
    if (removed_after != removed_before) {
      for (const std::string& s : reconciler_.BlockedServices()) {
        if (!batch.contains(s)) sh->MarkDirty(s);
      }
    }
    if (!st.ok()) {
      spdlog::warn("services: {}; retrying in 1s", st.ToString());
      for (const std::string& key : batch) sh->dirty.insert(key);
      sh->retry = true;
      continue;
    }
    if (first) {
      sh->pruned = true;
      spdlog::info("services: {} Services programmed after the first full sync", changes.size());
    }
    sh->applied = gen;
  }
}

}  // namespace sluice::agent
