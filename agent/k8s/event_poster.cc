#include "agent/k8s/event_poster.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::k8s {

std::string EventJson(const EventObject& obj, const std::string& type, const std::string& reason,
                      const std::string& message, const std::string& host, absl::Time now) {
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", now, absl::UTCTimeZone());
  nlohmann::json involved = {{"kind", obj.kind},
                             {"apiVersion", obj.api_version},
                             {"namespace", obj.namespace_},
                             {"name", obj.name}};
  if (!obj.uid.empty()) involved["uid"] = obj.uid;
  nlohmann::json ev = {{"apiVersion", "v1"},
                       {"kind", "Event"},
                       // kubelet's naming: the object's name and the time in hex nanoseconds.
                       {"metadata",
                        {{"name", absl::StrFormat("%s.%x", obj.name, absl::ToUnixNanos(now))},
                         {"namespace", obj.namespace_}}},
                       {"involvedObject", involved},
                       {"type", type},
                       {"reason", reason},
                       {"message", message},
                       {"source", {{"component", "sluice-agent"}, {"host", host}}},
                       {"reportingComponent", "sluice-agent"},
                       {"reportingInstance", host},
                       {"firstTimestamp", ts},
                       {"lastTimestamp", ts},
                       {"count", 1}};
  return ev.dump();
}

EventPoster::EventPoster(HttpClient& http, std::string host, const Clock* clock, size_t max_queued)
    : http_(http), host_(std::move(host)), clock_(clock), max_queued_(max_queued), thread_([this] {
        Run();
      }) {}

EventPoster::~EventPoster() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  cancel_.Cancel();
  thread_.join();
}

void EventPoster::Post(const EventObject& obj, std::string type, std::string reason,
                       std::string message) {
  absl::MutexLock l(&mu_);
  if (queue_.size() >= max_queued_) {
    queue_.pop_front();
    ++stats_.dropped;
  }
  queue_.push_back({obj, std::move(type), std::move(reason), std::move(message), clock_->Now()});
}

EventPosterStats EventPoster::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void EventPoster::Run() {
  for (;;) {
    Pending p;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &EventPoster::HasWork));
      if (stop_) return;
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    HttpRequest req;
    req.method = "POST";
    req.path = absl::StrCat("/api/v1/namespaces/", p.obj.namespace_, "/events");
    req.body = EventJson(p.obj, p.type, p.reason, p.message, host_, p.at);
    req.timeout = absl::Seconds(10);
    HttpResult r = http_.Send(req, nullptr, &cancel_);
    absl::MutexLock l(&mu_);
    if (r.ok()) {
      ++stats_.posted;
    } else if (!r.cancelled) {
      ++stats_.failed;
      spdlog::warn("events: post {} for {} {}/{}: {}", p.reason, p.obj.kind, p.obj.namespace_,
                   p.obj.name, r.Describe());
    }
  }
}

}  // namespace sluice::k8s
