// The reflector: client-go's ListAndWatch for one kind. Paginated LIST (limit + continue) into
// Store::Replace, then WATCH from the list's resourceVersion with bookmarks, re-watching from the
// last seen resourceVersion when a stream ends, relisting on 410 Expired, and backing off
// (jittered, exponential) on everything else. resourceVersions are opaque strings.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/k8s/decode.h"
#include "agent/k8s/http_client.h"
#include "agent/k8s/store.h"

namespace sluice::k8s {

// What kube-proxy sends for Services and EndpointSlices: skip objects owned by another proxy and
// headless Services.
inline constexpr char kServiceProxyLabelSelector[] =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(800);
  double factor = 2.0;
  absl::Duration cap = absl::Seconds(30);
  // Each delay is base * (1 + jitter * U[0,1)), then capped at `cap`.
  double jitter = 1.0;
  // The sequence restarts from `initial` after this long without a back-off.
  absl::Duration reset_after = absl::Minutes(2);
};

class Backoff {
 public:
  Backoff(BackoffOptions opts, const Clock* clock, RandomFn random)
      : opts_(opts), clock_(clock), random_(std::move(random)), base_(opts.initial) {}
  absl::Duration Next();

 private:
  const BackoffOptions opts_;
  const Clock* const clock_;
  const RandomFn random_;
  absl::Duration base_;
  absl::Time last_ = absl::InfinitePast();
};

struct ReflectorOptions {
  std::string label_selector;
  std::string field_selector;
  int page_limit = 500;  // 0 = no pagination
  // Each watch asks for timeoutSeconds uniform in [min, 2*min) (client-go: 5..10 min).
  absl::Duration min_watch_timeout = absl::Minutes(5);
  // A watch is abandoned after timeoutSeconds + this long without a byte.
  absl::Duration watch_idle_slack = absl::Seconds(30);
  // Per list page (a slow apiserver must still finish a page within it).
  absl::Duration list_page_timeout = absl::Minutes(5);
  // A watch that ends cleanly sooner than this with no event counts as a failure.
  absl::Duration min_watch_duration = absl::Seconds(1);
  // Watch ERROR events with code 500 are retried by re-watching for this long, then relist.
  absl::Duration max_internal_error_retry = absl::Seconds(30);
  BackoffOptions backoff;
  const Clock* clock = nullptr;  // null = RealClock
  RandomFn random;         // null = DefaultRandom()
};

struct ReflectorCounters {
  uint64_t lists = 0;             // completed (re)lists
  uint64_t list_pages = 0;
  uint64_t list_items = 0;
  uint64_t relists = 0;           // lists after the first
  uint64_t watches = 0;           // watch requests started
  uint64_t events = 0;            // ADDED/MODIFIED/DELETED applied
  uint64_t bookmarks = 0;
  uint64_t expired = 0;           // 410 (HTTP or ERROR event), continue-token expiry included
  uint64_t decode_errors = 0;     // malformed items/events/streams
  uint64_t backoffs = 0;          // back-off sleeps taken
  uint64_t transport_errors = 0;  // connect failures, cut streams, timeouts
  uint64_t http_errors = 0;       // non-2xx other than 410
  uint64_t short_watches = 0;     // clean ends with no event before min_watch_duration
};

// The per-kind half of a reflector: decodes items and events and applies them to a store.
class ReflectorSink {
 public:
  virtual ~ReflectorSink() = default;
  virtual std::string_view kind() const = 0;
  virtual std::string_view path() const = 0;
  virtual void BeginList() = 0;
  // Decodes one list item into the pending list; an error means the item was skipped.
  virtual absl::Status AddListItem(std::string_view json, Decoder& decoder) = 0;
  virtual void CommitList(std::string resource_version) = 0;
  // ADDED/MODIFIED/DELETED; sets *rv to the object's resourceVersion.
  virtual absl::Status ApplyEvent(EventType type, std::string_view object_json, Decoder& decoder,
                                  std::string* rv) = 0;
};

template <typename T>
class StoreSink : public ReflectorSink {
 public:
  explicit StoreSink(Store<T>* store) : store_(store) {}
  std::string_view kind() const override { return KindInfo<T>::kKind; }
  std::string_view path() const override { return KindInfo<T>::kPath; }
  void BeginList() override { pending_.clear(); }
  absl::Status AddListItem(std::string_view json, Decoder& decoder) override {
    T obj;
    absl::Status st = decoder.Decode(json, &obj);
    if (st.ok()) pending_.push_back(std::move(obj));
    return st;
  }
  void CommitList(std::string resource_version) override {
    store_->Replace(std::move(pending_), std::move(resource_version));
    pending_.clear();
  }
  absl::Status ApplyEvent(EventType type, std::string_view object_json, Decoder& decoder,
                          std::string* rv) override {
    T obj;
    absl::Status st = decoder.Decode(object_json, &obj);
    if (!st.ok()) return st;
    *rv = obj.meta.resource_version;
    if (type == EventType::kDeleted) {
      store_->Delete(obj);
    } else {
      store_->Upsert(std::move(obj));
    }
    return absl::OkStatus();
  }

 private:
  Store<T>* const store_;
  std::vector<T> pending_;
};

class Reflector {
 public:
  Reflector(HttpClient* http, std::unique_ptr<ReflectorSink> sink, ReflectorOptions opts);
  ~Reflector();

  void Start();
  // Cancels the in-flight request and any back-off sleep, then joins. Idempotent.
  void Stop();

  ReflectorCounters counters() const;
  // The last resourceVersion seen (list, event or bookmark).
  std::string last_resource_version() const;
  std::string_view kind() const { return sink_->kind(); }

 private:
  enum class Next { kWatch, kRewatchNow, kBackoffRewatch, kRelistNow, kBackoffRelist, kStopped };

  void Run();
  Next List();
  Next Watch();
  bool BackoffSleep();
  std::string Query(std::initializer_list<std::pair<std::string_view, std::string>> params) const;
  void SetLastRv(std::string rv);
  bool stopping() const { return stop_.HasBeenNotified(); }

  HttpClient* const http_;
  const std::unique_ptr<ReflectorSink> sink_;
  const ReflectorOptions opts_;
  const Clock* const clock_;
  const RandomFn random_;
  Backoff backoff_;
  Decoder decoder_;  // reflector thread only
  Canceller canceller_;
  absl::Notification stop_;
  std::thread thread_;

  // Reflector thread state (client-go names).
  std::string last_sync_rv_;           // RV of the last completed list
  bool rv_unavailable_ = false;        // the last list got Expired/TooLarge: relist with RV=""
  bool unpaginated_next_ = false;      // a continue token expired twice in a row: list in one go
  bool continue_expired_ = false;
  std::optional<absl::Duration> retry_after_;
  std::optional<absl::Time> internal_errors_since_;

  mutable absl::Mutex mu_;
  std::string last_rv_ ABSL_GUARDED_BY(mu_);

  struct AtomicCounters {
    std::atomic<uint64_t> lists{0}, list_pages{0}, list_items{0}, relists{0}, watches{0},
        events{0}, bookmarks{0}, expired{0}, decode_errors{0}, backoffs{0}, transport_errors{0},
        http_errors{0}, short_watches{0};
  } c_;
};

template <typename T>
std::unique_ptr<Reflector> MakeReflector(HttpClient* http, Store<T>* store,
                                         ReflectorOptions opts = {}) {
  return std::make_unique<Reflector>(http, std::make_unique<StoreSink<T>>(store), std::move(opts));
}

// Percent-encodes a query parameter value.
std::string QueryEscape(std::string_view s);

}  // namespace sluice::k8s
