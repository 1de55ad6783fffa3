#include "agent/k8s/reflector.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "agent/k8s/framing.h"
#include "spdlog/spdlog.h"

namespace sluice::k8s {
namespace {

bool Unreserved(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '~';
}

// Status of a non-2xx response (best effort: an empty Status if the body is not one).
ApiStatus ResponseStatus(Decoder& decoder, const HttpResult& r) {
  ApiStatus st;
  if (!r.error_body.empty() && !decoder.Decode(r.error_body, &st).ok()) st = ApiStatus{};
  if (st.code == 0) st.code = static_cast<int32_t>(r.status);
  return st;
}

}  // namespace

std::string QueryEscape(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (Unreserved(c)) {
      out.push_back(c);
    } else {
      const auto u = static_cast<unsigned char>(c);
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

Reflector::Reflector(HttpClient* http, std::unique_ptr<ReflectorSink> sink, ReflectorOptions opts)
    : http_(http),
      sink_(std::move(sink)),
      opts_(std::move(opts)),
      clock_(opts_.clock != nullptr ? opts_.clock : RealClock::Get()),
      random_(opts_.random ? opts_.random : DefaultRandom()),
      backoff_(opts_.backoff, clock_, random_),
      expired_backoff_(opts_.backoff, clock_, random_) {}

Reflector::~Reflector() { Stop(); }

void Reflector::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Reflector::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  canceller_.Cancel();
  if (thread_.joinable()) thread_.join();
}

ReflectorCounters Reflector::counters() const {
  ReflectorCounters out;
  out.lists = c_.lists;
  out.list_pages = c_.list_pages;
  out.list_items = c_.list_items;
  out.relists = c_.relists;
  out.watches = c_.watches;
  out.events = c_.events;
  out.bookmarks = c_.bookmarks;
  out.expired = c_.expired;
  out.decode_errors = c_.decode_errors;
  out.undecodable_deletes = c_.undecodable_deletes;
  out.undecodable_removals = c_.undecodable_removals;
  out.backoffs = c_.backoffs;
  out.transport_errors = c_.transport_errors;
  out.http_errors = c_.http_errors;
  out.short_watches = c_.short_watches;
  return out;
}

std::string Reflector::last_resource_version() const {
  absl::MutexLock lock(&mu_);
  return last_rv_;
}

void Reflector::SetLastRv(std::string rv) {
  absl::MutexLock lock(&mu_);
  last_rv_ = std::move(rv);
}

std::string Reflector::Query(
    std::initializer_list<std::pair<std::string_view, std::string>> params) const {
  std::string q(sink_->path());
  char sep = '?';
  auto add = [&](std::string_view k, const std::string& v) {
    absl::StrAppend(&q, std::string(1, sep), std::string(k), "=", QueryEscape(v));
    sep = '&';
  };
  for (const auto& [k, v] : params) {
    if (!v.empty()) add(k, v);
  }
  if (!opts_.label_selector.empty()) add("labelSelector", opts_.label_selector);
  if (!opts_.field_selector.empty()) add("fieldSelector", opts_.field_selector);
  return q;
}

bool Reflector::BackoffSleep() {
  absl::Duration d =
      backoff_.Next(unreachable_ ? opts_.backoff.unreachable_cap : opts_.backoff.cap);
  unreachable_ = false;
  if (retry_after_.has_value()) {
    d = std::min(std::max(d, *retry_after_), std::max(opts_.backoff.cap, *retry_after_));
    retry_after_.reset();
  }
  ++c_.backoffs;
  spdlog::debug("k8s {}: backing off {}", std::string(kind()), absl::FormatDuration(d));
  return clock_->SleepFor(d, stop_);
}

bool Reflector::WaitBeforeExpiredRelist() {
  if (!expired_since_healthy_watch_) {
    // The first 410 since a healthy watch is news (a compaction, a watch that fell behind): the
    // relist is what brings the store up to date, so it goes at once.
    expired_since_healthy_watch_ = true;
    return true;
  }
  const absl::Duration d = expired_backoff_.Next();
  ++c_.backoffs;
  spdlog::info("k8s {}: relisting in {} (410 Gone)", std::string(kind()), absl::FormatDuration(d));
  return clock_->SleepFor(d, stop_);
}

void Reflector::Run() {
  Next next = Next::kRelistNow;
  while (!stopping()) {
    switch (next) {
      case Next::kExpiredRelist:
        if (!WaitBeforeExpiredRelist()) return;
        next = List();
        break;
      case Next::kBackoffRelist:
        if (!BackoffSleep()) return;
        [[fallthrough]];
      case Next::kRelistNow:
        next = List();
        break;
      case Next::kBackoffRewatch:
        if (!BackoffSleep()) return;
        [[fallthrough]];
      case Next::kWatch:
      case Next::kRewatchNow:
        next = Watch();
        break;
      case Next::kStopped:
        return;
    }
  }
}

Reflector::Next Reflector::List() {
  const std::string kind_name(kind());
  // client-go's relistResourceVersion: "" after Expired/TooLarge, "0" (any, from the watch cache)
  // the first time, else the last synced RV (not older than).
  const std::string rv = rv_unavailable_ ? "" : (last_sync_rv_.empty() ? "0" : last_sync_rv_);
  const bool paginate = opts_.page_limit > 0 && !unpaginated_next_;
  sink_->BeginList();
  ListMeta meta;
  std::string cont;
  for (int page = 0;; ++page) {
    const std::string limit = paginate ? absl::StrCat(opts_.page_limit) : "";
    const std::string path = cont.empty() ? Query({{"limit", limit}, {"resourceVersion", rv}})
                                          : Query({{"limit", limit}, {"continue", cont}});
    ListFramer framer;
    absl::Status framing;
    meta = ListMeta{};
    ListFramer::Callbacks cb;
    cb.on_metadata = [&](std::string_view json) { return decoder_.Decode(json, &meta); };
    cb.on_item = [&](std::string_view json) {
      SinkOutcome o = sink_->AddListItem(json, decoder_);
      if (o.decode_error.ok()) {
        ++c_.list_items;
        return absl::OkStatus();
      }
      ++c_.decode_errors;
      if (!o.applied) {
        spdlog::warn("k8s {}: skipping a list item without a readable name: {}", kind_name,
                     o.decode_error.ToString());
      } else {
        ++c_.undecodable_removals;
        if (o.first_report) {
          spdlog::warn("k8s {} {}: cannot decode it ({}); treated as absent until it decodes",
                       kind_name, o.key, std::string(o.decode_error.message()));
        }
      }
      return absl::OkStatus();
    };
    HttpRequest req;
    req.path = path;
    req.timeout = opts_.list_page_timeout;
    req.accept_gzip = true;
    HttpResult r = http_->Get(
        req,
        [&](std::string_view bytes) {
          framing = framer.Feed(bytes, cb);
          return framing.ok();
        },
        &canceller_);
    if (stopping() || r.cancelled) return Next::kStopped;

    if (r.curl_code == 0 && r.status >= 200 && r.status < 300) {
      if (framing.ok()) framing = framer.Finish();
      if (!framing.ok()) {
        ++c_.decode_errors;
        spdlog::warn("k8s {}: list {}: {}", kind_name, path, framing.ToString());
        return Next::kBackoffRelist;
      }
      ++c_.list_pages;
      continue_expired_ = false;
      if (meta.continue_token.empty()) break;
      cont = meta.continue_token;
      continue;
    }
    if (r.aborted_by_callback) {
      ++c_.decode_errors;
      spdlog::warn("k8s {}: list {}: {}", kind_name, path, framing.ToString());
      return Next::kBackoffRelist;
    }
    if (r.status == 0 || r.curl_code != 0) {
      ++c_.transport_errors;
      unreachable_ = true;
      spdlog::warn("k8s {}: list {}: {}", kind_name, path, r.Describe());
      return Next::kBackoffRelist;
    }
    ApiStatus st = ResponseStatus(decoder_, r);
    if (st.IsExpired()) {
      ++c_.expired;
      if (!cont.empty()) {
        // Never stitch pages of different snapshots: restart the whole list, in one piece if the
        // token keeps expiring (a list slower than the token's lifetime).
        spdlog::info("k8s {}: continue token expired; restarting the list", kind_name);
        if (continue_expired_) unpaginated_next_ = true;
        continue_expired_ = true;
        rv_unavailable_ = true;
        return Next::kRelistNow;
      }
      if (!rv.empty()) {
        rv_unavailable_ = true;
        return Next::kRelistNow;
      }
    } else if (st.IsTooLargeResourceVersion() && !rv.empty()) {
      rv_unavailable_ = true;
      return Next::kRelistNow;
    }
    ++c_.http_errors;
    retry_after_ = r.retry_after;
    if (!retry_after_ && st.retry_after_seconds > 0) {
      retry_after_ = absl::Seconds(st.retry_after_seconds);
    }
    if (r.status == 401 || r.status == 403) {
      spdlog::error("k8s {}: list {}: {} {}: check the agent's credentials and RBAC", kind_name,
                    path, r.status, st.message);
    } else {
      spdlog::warn("k8s {}: list {}: HTTP {} {} {}", kind_name, path, r.status, st.reason,
                   st.message);
    }
    return Next::kBackoffRelist;
  }

  if (c_.lists > 0) ++c_.relists;
  ++c_.lists;
  last_sync_rv_ = meta.resource_version;
  rv_unavailable_ = false;
  unpaginated_next_ = false;
  internal_errors_since_.reset();
  SetLastRv(meta.resource_version);
  sink_->CommitList(meta.resource_version);
  spdlog::info("k8s {}: listed at resourceVersion {}", kind_name, meta.resource_version);
  return Next::kWatch;
}

Reflector::Next Reflector::Watch() {
  const std::string kind_name(kind());
  const std::string from_rv = last_resource_version();
  const double r01 = random_();
  const int64_t timeout_s =
      std::max<int64_t>(1, absl::ToInt64Seconds(opts_.min_watch_timeout * (1.0 + r01)));
  const std::string path = Query({{"watch", "1"},
                                  {"resourceVersion", from_rv},
                                  {"allowWatchBookmarks", "true"},
                                  {"timeoutSeconds", absl::StrCat(timeout_s)}});
  EventFramer framer;
  absl::Status stream_error;
  std::optional<Next> outcome;  // decided by an ERROR event
  uint64_t events = 0;
  uint64_t delivered = 0;  // object events and bookmarks: the stream was healthy
  bool expired = false;    // ended by an ERROR 410

  auto on_event = [&](std::string_view json) -> absl::Status {
    RawEvent ev;
    if (absl::Status st = decoder_.Decode(json, &ev); !st.ok()) {
      ++c_.decode_errors;
      return st;  // ends the stream; re-watch from the last applied RV
    }
    switch (ev.type) {
      case EventType::kAdded:
      case EventType::kModified:
      case EventType::kDeleted: {
        std::string rv;
        SinkOutcome o = sink_->ApplyEvent(ev.type, ev.object_json, decoder_, &rv);
        ++events;
        ++delivered;
        if (!o.decode_error.ok()) ++c_.decode_errors;
        if (!o.applied) {
          spdlog::warn("k8s {}: skipping a {} event without a readable name: {}", kind_name,
                       ev.type_name, o.decode_error.ToString());
          return absl::OkStatus();
        }
        // The resourceVersion moves before any counter does: whoever sees an event counted sees
        // the version past it too.
        if (!rv.empty()) SetLastRv(std::move(rv));
        if (o.by_identity && ev.type == EventType::kDeleted) {
          ++c_.undecodable_deletes;
          spdlog::info("k8s {} {}: DELETED event does not decode ({}); deleted by name", kind_name,
                       o.key, std::string(o.decode_error.message()));
        } else if (o.by_identity) {
          ++c_.undecodable_removals;
          if (o.first_report) {
            spdlog::warn("k8s {} {}: cannot decode its {} ({}); removed until it decodes",
                         kind_name, o.key, ev.type_name, std::string(o.decode_error.message()));
          }
        }
        ++c_.events;
        return absl::OkStatus();
      }
      case EventType::kBookmark: {
        std::string rv;
        ++events;
        ++delivered;
        if (absl::Status st = decoder_.DecodeResourceVersion(ev.object_json, &rv); !st.ok()) {
          ++c_.decode_errors;
          return absl::OkStatus();
        }
        if (!rv.empty()) SetLastRv(std::move(rv));
        ++c_.bookmarks;
        return absl::OkStatus();
      }
      case EventType::kError: {
        ++events;
        ApiStatus st;
        if (!decoder_.Decode(ev.object_json, &st).ok()) ++c_.decode_errors;
        if (st.IsExpired()) {
          ++c_.expired;
          spdlog::info("k8s {}: watch from {} expired ({}); relisting", kind_name, from_rv,
                       st.message);
          expired = true;
          outcome = Next::kExpiredRelist;
        } else if (st.IsTooLargeResourceVersion()) {
          rv_unavailable_ = true;
          outcome = Next::kBackoffRelist;
        } else if (st.code == 500) {
          const absl::Time now = clock_->Now();
          if (!internal_errors_since_) internal_errors_since_ = now;
          outcome = now - *internal_errors_since_ > opts_.max_internal_error_retry
                        ? Next::kBackoffRelist
                        : Next::kBackoffRewatch;
          ++c_.http_errors;
        } else {
          ++c_.http_errors;
          spdlog::warn("k8s {}: watch ERROR event: {} {} {}", kind_name, st.code, st.reason,
                       st.message);
          if (st.retry_after_seconds > 0) retry_after_ = absl::Seconds(st.retry_after_seconds);
          outcome = Next::kBackoffRewatch;
        }
        // Whatever the server sends after an ERROR is not trusted; end the stream.
        return absl::CancelledError("watch ERROR event");
      }
      case EventType::kUnknown:
        spdlog::warn("k8s {}: ignoring watch event of unknown type {}", kind_name, ev.type_name);
        return absl::OkStatus();
    }
    return absl::OkStatus();
  };

  HttpRequest req;
  req.path = path;
  req.idle_timeout = absl::Seconds(timeout_s) + opts_.watch_idle_slack;
  ++c_.watches;
  const absl::Time start = clock_->Now();
  HttpResult r = http_->Get(
      req,
      [&](std::string_view bytes) {
        stream_error = framer.Feed(bytes, on_event);
        return stream_error.ok();
      },
      &canceller_);
  if (stopping() || r.cancelled) return Next::kStopped;
  if (delivered > 0) backoff_.Reset();
  // A watch that streamed for a while is healthy even if its kind was quiet: a 410 after it is
  // news (a compaction), not the server expiring every watch at once.
  const bool streamed =
      r.status >= 200 && r.status < 300 && clock_->Now() - start >= opts_.min_watch_duration;
  if (delivered > 0 || streamed) {
    expired_since_healthy_watch_ = false;
    expired_backoff_.Reset();
  }
  if (outcome.has_value()) {
    if (expired) internal_errors_since_.reset();
    return *outcome;
  }
  if (!stream_error.ok()) {
    spdlog::warn("k8s {}: watch stream from {}: {}", kind_name, from_rv, stream_error.ToString());
    return Next::kBackoffRewatch;
  }
  if (r.status == 0 || (r.status >= 200 && r.status < 300)) {
    if (r.curl_code != 0) {
      // Cut, reset or idle: complete events were applied, a torn tail (if any) is dropped with
      // the framer.
      ++c_.transport_errors;
      unreachable_ = true;
      spdlog::info("k8s {}: watch from {} ended: {} ({} events, {} bytes torn)", kind_name,
                   from_rv, r.Describe(), events, framer.partial_bytes());
      return Next::kBackoffRewatch;
    }
    // Clean end (timeoutSeconds reached).
    if (events == 0 && clock_->Now() - start < opts_.min_watch_duration) {
      ++c_.short_watches;
      spdlog::warn("k8s {}: watch from {} ended at once with no event", kind_name, from_rv);
      return Next::kBackoffRewatch;
    }
    internal_errors_since_.reset();
    return Next::kRewatchNow;
  }
  ApiStatus st = ResponseStatus(decoder_, r);
  if (st.IsExpired()) {
    ++c_.expired;
    spdlog::info("k8s {}: watch from {} got HTTP {}; relisting", kind_name, from_rv, r.status);
    return Next::kExpiredRelist;
  }
  ++c_.http_errors;
  retry_after_ = r.retry_after;
  if (!retry_after_ && st.retry_after_seconds > 0) {
    retry_after_ = absl::Seconds(st.retry_after_seconds);
  }
  if (st.IsTooLargeResourceVersion()) {
    rv_unavailable_ = true;
    return Next::kBackoffRelist;
  }
  if (r.status == 401 || r.status == 403) {
    spdlog::error("k8s {}: watch: HTTP {} {}: check the agent's credentials and RBAC", kind_name,
                  r.status, st.message);
  } else {
    spdlog::warn("k8s {}: watch: HTTP {} {} {}", kind_name, r.status, st.reason, st.message);
  }
  return Next::kBackoffRewatch;
}

}  // namespace sluice::k8s
