#include "agent/lab/node/events.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace sluice::lab {

using nlohmann::json;

absl::Status EventRecorder::Record(const json& object, const std::string& type,
                                   const std::string& reason, const std::string& message,
                                   const EventSource& source, const std::string& field_path) {
  const json metadata = object.value("metadata", json::object());
  const std::string name = metadata.value("name", "");
  std::string ns = metadata.value("namespace", "");
  json involved = {{"kind", object.value("kind", "")},
                   {"name", name},
                   {"uid", metadata.value("uid", "")},
                   {"apiVersion", object.value("apiVersion", "v1")},
                   {"resourceVersion", metadata.value("resourceVersion", "")}};
  if (!ns.empty()) involved["namespace"] = ns;
  if (!field_path.empty()) involved["fieldPath"] = field_path;
  if (ns.empty()) ns = "default";
  const std::string key =
      absl::StrCat(involved["uid"].get<std::string>(), "|", field_path, "|", type, "|", reason, "|",
                   message, "|", source.component, "|", source.host);
  const absl::Time now_time = store_->clock()->Now();
  const std::string now = ObjectStore::FormatTimestamp(now_time);
  const ResourceType& events = Resource("events");

  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    std::vector<std::string> nn = absl::StrSplit(it->second, absl::MaxSplits('/', 1));
    auto bumped = store_->Update(events, nn[0], nn[1], [&](json& ev) {
      ev["count"] = ev.value("count", 1) + 1;
      ev["lastTimestamp"] = now;
      ev["involvedObject"]["resourceVersion"] = involved["resourceVersion"];
      return absl::OkStatus();
    });
    if (bumped.ok()) return absl::OkStatus();
    if (bumped.status().code() != absl::StatusCode::kNotFound) return bumped.status();
    // Deleted by someone else: record it afresh.
    by_key_.erase(it);
    order_.erase(
        std::remove_if(order_.begin(), order_.end(), [&](const auto& e) { return e.first == key; }),
        order_.end());
  }
  // kubelet's naming: the object's name and the time in hex nanoseconds.
  last_suffix_ = std::max(last_suffix_ + 1, absl::ToUnixNanos(now_time));
  const std::string event_name = absl::StrFormat("%s.%x", name, last_suffix_);
  json ev = {{"apiVersion", "v1"},
             {"kind", "Event"},
             {"metadata", {{"name", event_name}, {"namespace", ns}}},
             {"involvedObject", involved},
             {"reason", reason},
             {"message", message},
             {"source", {{"component", source.component}}},
             {"firstTimestamp", now},
             {"lastTimestamp", now},
             {"count", 1},
             {"type", type},
             {"eventTime", nullptr},
             {"reportingComponent", source.component},
             {"reportingInstance", source.host}};
  if (!source.host.empty()) ev["source"]["host"] = source.host;
  auto created = store_->Create(events, std::move(ev));
  if (!created.ok()) return created.status();
  const std::string nn = absl::StrCat(ns, "/", event_name);
  by_key_[key] = nn;
  order_.emplace_back(key, nn);
  while (order_.size() > limit_) {
    auto [old_key, old_nn] = order_.front();
    order_.pop_front();
    by_key_.erase(old_key);
    std::vector<std::string> parts = absl::StrSplit(old_nn, absl::MaxSplits('/', 1));
    (void)store_->Delete(events, parts[0], parts[1], {});  // already gone is fine
  }
  return absl::OkStatus();
}

size_t EventRecorder::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_.size();
}

}  // namespace sluice::lab
