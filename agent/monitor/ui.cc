#include "agent/monitor/ui.h"

#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::monitor {

absl::StatusOr<std::unique_ptr<FlowUi>> FlowUi::Start(const std::string& address,
                                                      FlowMonitor* monitor, const std::string& node,
                                                      size_t flows, const Clock* clock) {
  std::unique_ptr<FlowUi> ui(new FlowUi(monitor, node, flows, clock));
  FlowUi* self = ui.get();
  std::vector<metrics::Route> routes = {
      {"/",
       [] {
         return metrics::HttpReply{200, "text/html; charset=utf-8", kFlowUiPage};
       }},
      {"/flows.json",
       [self] {
         return metrics::HttpReply{200, "application/json", self->FlowsJson()};
       }},
  };
  auto http = metrics::HttpServer::Start(address, std::move(routes));
  if (!http.ok()) return http.status();
  ui->http_ = std::move(*http);
  ui->loop_ = std::thread([self] { self->Loop(); });
  spdlog::info("ui: the service map page on http://{}/ (port {})", address, ui->http_->port());
  return ui;
}

FlowUi::~FlowUi() {
  http_.reset();  // no poll arrives once the loop is told to stop
  stopping_ = true;
  {
    absl::MutexLock l(&mu_);
    poked_ = true;
  }
  if (loop_.joinable()) loop_.join();
}

std::string FlowUi::FlowsJson() {
  wanted_until_ns_ = absl::ToUnixNanos(clock_->Now() + kLinger);
  {
    absl::MutexLock l(&mu_);
    poked_ = true;
  }
  std::vector<Flow> history;
  monitor_->Observe(FlowFilter{}, flows_, /*follow=*/false, &history);
  nlohmann::json out = {{"node", node_},
                        {"observing", true},
                        {"lingerSeconds", absl::ToInt64Seconds(kLinger)},
                        {"flows", nlohmann::json::array()}};
  for (const Flow& f : history) out["flows"].push_back(FlowToJson(f));
  return out.dump();
}

void FlowUi::Loop() {
  std::unique_ptr<FlowMonitor::Observer> live;
  while (!stopping_) {
    const bool wanted = absl::ToUnixNanos(clock_->Now()) < wanted_until_ns_.load();
    if (wanted && !live) {
      std::vector<Flow> ignored;
      live = monitor_->Observe(FlowFilter{}, 0, /*follow=*/true, &ignored);
    } else if (!wanted && live) {
      live.reset();
    }
    if (live) {
      // The monitor keeps every flow in its history, which the page reads: drain and drop.
      live->Next(absl::Milliseconds(200));
      if (live->stopped()) live.reset();
    } else {
      // Idle until a poll (or the stop); the timeout only re-checks the linger deadline.
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&poked_), absl::Seconds(1));
      poked_ = false;
    }
  }
}

}  // namespace sluice::monitor
