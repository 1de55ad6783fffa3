#include "agent/metrics/drop_window.h"

#include "loader/datapath.h"
#include "maps/sluice_maps.h"
#include "nlohmann/json.hpp"

namespace sluice::metrics {

DropWindow::DropWindow(DropWindowOptions options) : options_(std::move(options)) {
  SampleNow();
  if (options_.sample_in_background) {
    thread_ = std::thread([this] {
      while (options_.clock->SleepFor(options_.step, stop_)) SampleNow();
    });
  }
}

DropWindow::~DropWindow() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void DropWindow::SampleNow() {
  auto drops = maps::DropMap::Open(maps::PinPath(options_.bpffs_root, maps::name::sluice_drops));
  if (!drops.ok()) return;
  auto totals = loader::ReadDropTotals(*drops);
  if (!totals.ok()) return;
  std::map<std::string, uint64_t> sample;
  for (const auto& t : *totals) sample[t.name] = t.packets;
  const absl::Time now = options_.clock->Now();
  absl::MutexLock l(&mu_);
  samples_.emplace_back(now, std::move(sample));
  // Keep one sample at or before the window's start, so the window is covered whole.
  while (samples_.size() > 2 && samples_[1].first <= now - options_.window) samples_.pop_front();
}

DropWindow::Recent DropWindow::Get() const {
  Recent r;
  absl::MutexLock l(&mu_);
  if (samples_.size() < 2) return r;
  const auto& [then, old] = samples_.front();
  const auto& [now, cur] = samples_.back();
  r.span = now - then;
  for (const auto& [reason, n] : cur) {
    auto it = old.find(reason);
    uint64_t before = it == old.end() ? 0 : it->second;
    if (n > before) r.packets[reason] = n - before;  // a replaced map restarts from 0
  }
  return r;
}

std::string DropWindow::Json() const {
  Recent r = Get();
  nlohmann::json out = {{"windowSeconds", absl::ToInt64Seconds(r.span)},
                        {"packets", nlohmann::json::object()}};
  for (const auto& [reason, n] : r.packets) out["packets"][reason] = n;
  return out.dump(2);
}

}  // namespace sluice::metrics
