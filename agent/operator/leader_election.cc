#include "agent/operator/leader_election.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/k8s/http_client.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

using nlohmann::json;

// metav1.MicroTime.
std::string FormatMicroTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

absl::Time ParseMicroTime(const std::string& s) {
  absl::Time t;
  std::string err;
  if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", s, absl::UTCTimeZone(), &t, &err) &&
      !absl::ParseTime(absl::RFC3339_full, s, &t, &err)) {
    return absl::UnixEpoch();
  }
  return t;
}

class KubernetesLeaseClient : public LeaseClient {
 public:
  KubernetesLeaseClient(k8s::HttpClient* http, std::string ns, std::string name)
      : http_(http), ns_(std::move(ns)), name_(std::move(name)) {}

  absl::StatusOr<std::optional<LeaseRecord>> Get() override {
    std::string body;
    k8s::HttpResult r = Call("GET", Path(true), "", &body);
    if (r.status == 404) return std::nullopt;
    if (!r.ok()) return Error("get", r);
    return Decode(body);
  }

  absl::StatusOr<LeaseRecord> Create(const LeaseRecord& record) override {
    std::string body;
    k8s::HttpResult r = Call("POST", Path(false), Encode(record).dump(), &body);
    if (!r.ok()) return Error("create", r);
    return Decode(body);
  }

  absl::StatusOr<LeaseRecord> Update(const LeaseRecord& record) override {
    std::string body;
    k8s::HttpResult r = Call("PUT", Path(true), Encode(record).dump(), &body);
    if (!r.ok()) return Error("update", r);
    return Decode(body);
  }

 private:
  std::string Path(bool with_name) const {
    std::string p = absl::StrCat("/apis/coordination.k8s.io/v1/namespaces/", ns_, "/leases");
    if (with_name) absl::StrAppend(&p, "/", name_);
    return p;
  }

  k8s::HttpResult Call(const std::string& method, const std::string& path, std::string payload,
                       std::string* out) {
    k8s::HttpRequest req;
    req.method = method;
    req.path = path;
    req.body = std::move(payload);
    req.timeout = absl::Seconds(10);
    return http_->Send(req, [out](std::string_view s) {
      out->append(s);
      return true;
    });
  }

  absl::Status Error(const char* what, const k8s::HttpResult& r) const {
    std::string msg = absl::StrCat(what, " lease ", ns_, "/", name_, ": ", r.Describe());
    if (!r.error_body.empty()) {
      json status = json::parse(r.error_body, nullptr, false);
      if (status.is_object()) absl::StrAppend(&msg, ": ", status.value("message", ""));
    }
    if (r.status == 409) {
      return std::string_view(what) == "create" ? absl::AlreadyExistsError(msg)
                                                : absl::AbortedError(msg);
    }
    return absl::UnavailableError(msg);
  }

  json Encode(const LeaseRecord& rec) const {
    json spec = {{"holderIdentity", rec.holder},
                 {"leaseDurationSeconds", absl::ToInt64Seconds(rec.lease_duration)},
                 {"acquireTime", FormatMicroTime(rec.acquire_time)},
                 {"renewTime", FormatMicroTime(rec.renew_time)},
                 {"leaseTransitions", rec.transitions}};
    json meta = {{"name", name_}, {"namespace", ns_}};
    if (!rec.resource_version.empty()) meta["resourceVersion"] = rec.resource_version;
    return json{{"apiVersion", "coordination.k8s.io/v1"},
                {"kind", "Lease"},
                {"metadata", meta},
                {"spec", spec}};
  }

  absl::StatusOr<LeaseRecord> Decode(const std::string& body) const {
    json obj = json::parse(body, nullptr, false);
    if (!obj.is_object()) {
      return absl::DataLossError(absl::StrCat("lease ", ns_, "/", name_, ": not a JSON object"));
    }
    LeaseRecord rec;
    const json spec = obj.value("spec", json::object());
    const json meta = obj.value("metadata", json::object());
    rec.resource_version = meta.value("resourceVersion", "");
    if (spec.contains("holderIdentity") && spec["holderIdentity"].is_string()) {
      rec.holder = spec["holderIdentity"].get<std::string>();
    }
    if (spec.contains("leaseDurationSeconds") && spec["leaseDurationSeconds"].is_number()) {
      rec.lease_duration = absl::Seconds(spec["leaseDurationSeconds"].get<int64_t>());
    }
    if (spec.contains("acquireTime") && spec["acquireTime"].is_string()) {
      rec.acquire_time = ParseMicroTime(spec["acquireTime"].get<std::string>());
    }
    if (spec.contains("renewTime") && spec["renewTime"].is_string()) {
      rec.renew_time = ParseMicroTime(spec["renewTime"].get<std::string>());
    }
    if (spec.contains("leaseTransitions") && spec["leaseTransitions"].is_number()) {
      rec.transitions = spec["leaseTransitions"].get<int>();
    }
    return rec;
  }

  k8s::HttpClient* const http_;
  const std::string ns_;
  const std::string name_;
};

}  // namespace

std::unique_ptr<LeaseClient> NewKubernetesLeaseClient(k8s::HttpClient* http, std::string ns,
                                                      std::string name) {
  return std::make_unique<KubernetesLeaseClient>(http, std::move(ns), std::move(name));
}

absl::Status ElectionOptions::Validate() const {
  if (identity.empty()) return absl::InvalidArgumentError("leader election: identity is empty");
  if (retry_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("leader election: retry_period must be > 0");
  }
  if (renew_deadline <= retry_period) {
    return absl::InvalidArgumentError("leader election: renew_deadline must exceed retry_period");
  }
  if (lease_duration <= renew_deadline) {
    return absl::InvalidArgumentError("leader election: lease_duration must exceed renew_deadline");
  }
  return absl::OkStatus();
}

LeaderElector::LeaderElector(LeaseClient* client, ElectionOptions options)
    : client_(client), options_(std::move(options)) {}

bool LeaderElector::TryAcquireOrRenew() {
  ++counters_.attempts;
  const absl::Time now = options_.clock->Now();
  LeaseRecord mine;
  mine.holder = options_.identity;
  mine.lease_duration = options_.lease_duration;
  mine.acquire_time = now;
  mine.renew_time = now;

  auto current = client_->Get();
  if (!current.ok()) {
    spdlog::warn("leader election: {}", current.status().ToString());
    ++counters_.failed_writes;
    return false;
  }
  if (!current->has_value()) {
    auto created = client_->Create(mine);
    if (!created.ok()) {
      spdlog::info("leader election: {}", created.status().ToString());
      ++counters_.failed_writes;
      return false;
    }
    observed_ = *created;
    observed_time_ = now;
    ++counters_.acquisitions;
    return true;
  }
  const LeaseRecord& seen = **current;
  // The holder's liveness is judged by when *we* saw its record change, never by its clock.
  if (!observed_ || !(*observed_ == seen)) {
    observed_ = seen;
    observed_time_ = now;
  }
  const bool held_by_me = seen.holder == options_.identity;
  if (!held_by_me && !seen.holder.empty() && observed_time_ + seen.lease_duration > now) {
    return false;  // another holder, not yet expired
  }
  if (held_by_me) {
    mine.acquire_time = seen.acquire_time;
    mine.transitions = seen.transitions;
  } else {
    mine.transitions = seen.transitions + 1;
  }
  mine.resource_version = seen.resource_version;
  auto updated = client_->Update(mine);
  if (!updated.ok()) {
    spdlog::info("leader election: {}", updated.status().ToString());
    ++counters_.failed_writes;
    return false;
  }
  observed_ = *updated;
  observed_time_ = now;
  if (held_by_me) {
    ++counters_.renewals;
  } else {
    ++counters_.acquisitions;
  }
  return true;
}

LeaderElector::State LeaderElector::Tick() {
  if (state_ == State::kLost) return state_;
  const bool held = TryAcquireOrRenew();
  const absl::Time now = options_.clock->Now();
  if (held) {
    if (state_ == State::kFollower) {
      spdlog::info("leader election: {} acquired the lease", options_.identity);
    }
    state_ = State::kLeader;
    last_renew_ = now;
  } else if (state_ == State::kLeader && now - last_renew_ >= options_.renew_deadline) {
    spdlog::error("leader election: {} could not renew the lease for {}: stepping down",
                  options_.identity, absl::FormatDuration(now - last_renew_));
    state_ = State::kLost;
  }
  return state_;
}

LeaderElector::State LeaderElector::Run(absl::Notification& stop,
                                        const std::function<void()>& on_leading) {
  bool started = false;
  while (!stop.HasBeenNotified()) {
    State s = Tick();
    if (s == State::kLost) return s;
    if (s == State::kLeader && !started) {
      started = true;
      if (on_leading) on_leading();
    }
    if (!options_.clock->SleepFor(options_.retry_period, stop)) break;
  }
  return state_;
}

absl::Status LeaderElector::Release() {
  if (state_ != State::kLeader || !observed_ || observed_->holder != options_.identity) {
    return absl::OkStatus();
  }
  LeaseRecord released = *observed_;
  released.holder = "";
  released.lease_duration = absl::Seconds(1);
  released.renew_time = options_.clock->Now();
  auto updated = client_->Update(released);
  if (!updated.ok()) return updated.status();
  observed_ = *updated;
  state_ = State::kFollower;
  return absl::OkStatus();
}

}  // namespace sluice::agent
