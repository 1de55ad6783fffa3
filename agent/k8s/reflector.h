// The reflector: client-go's ListAndWatch for one kind. Paginated LIST (limit + continue) into
// Store::Replace, then WATCH from the list's resourceVersion with bookmarks, re-watching from the
// last seen resourceVersion when a stream ends, relisting on 410 Expired, and backing off
// (jittered, exponential) on everything else. The first relist after a 410 since a healthy watch
// (one that delivered events, or streamed for min_watch_duration) goes at once: a compaction is
// no failure, and the relist is what converges the node. Every further one waits out a back-off
// of its own, so a server that answers every watch with 410 gets one list per 0.8-1.6, 1.6-3.2,
// ... 30 s, not a list-watch loop (29 cycles in 0.21 s before). client-go backs off before the
// first relist too (its ListAndWatch returns into wait.BackoffUntil), which costs 0.8-1.6 s of
// convergence after every compaction. resourceVersions are opaque strings.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/base/backoff.h"
#include "agent/base/clock.h"
#include "agent/k8s/decode.h"
#include "agent/k8s/http_client.h"
#include "agent/k8s/store.h"

namespace sluice::k8s {

// What kube-proxy sends for Services and EndpointSlices: skip objects owned by another proxy and
// headless Services.
inline constexpr char kServiceProxyLabelSelector[] =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

// The reflector's back-off (agent/base/backoff.h): its sequence also restarts whenever a watch
// has delivered an event or a bookmark (the stream was healthy; a cut after that is not the
// apiserver failing again).
struct BackoffOptions : sluice::BackoffOptions {
  // Cap while the apiserver does not answer at all (connection refused or reset, cut streams,
  // timeouts): a retry then costs the server nothing, and this bounds how long after it returns
  // the agent converges. Answers that are errors (5xx, 429, watches ending at once) back off up
  // to `cap`, and Retry-After is honoured.
  absl::Duration unreachable_cap = absl::Milliseconds(1500);
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
  // A watch that ends cleanly sooner than this with no event counts as a failure; one that
  // streamed this long restarts the back-off of relists after 410.
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
  // Objects the full decoder refused that were acted on by identity: DELETED events applied
  // anyway, and ADDED/MODIFIED/list objects removed from the store (counted per occurrence).
  uint64_t undecodable_deletes = 0;
  uint64_t undecodable_removals = 0;
  uint64_t backoffs = 0;          // back-off sleeps taken
  uint64_t transport_errors = 0;  // connect failures, cut streams, timeouts
  uint64_t http_errors = 0;       // non-2xx other than 410
  uint64_t short_watches = 0;     // clean ends with no event before min_watch_duration
};

// What a sink did with one list item or watch event object.
struct SinkOutcome {
  std::string key;            // "namespace/name" ("" when not even the identity decoded)
  absl::Status decode_error;  // the full decode's error; OK when the object decoded
  bool applied = false;       // the store was updated from this object (fully or by identity)
  bool by_identity = false;   // acted on from namespace/name alone: a DELETED, or a removal
  bool first_report = false;  // first time this object is refused with this error: log it
};

// The per-kind half of a reflector: decodes items and events and applies them to a store.
//
// An object the full decoder refuses (a value out of range, a wrong type) is never silently
// skipped: a DELETED event needs only the identity and deletes; an ADDED/MODIFIED object, or a
// list item, that does not decode is treated as absent, so what its previous version programmed
// is removed (the same outcome a relist gives, which cannot keep an object it cannot read). Each
// refused object is reported once (first_report) until it decodes again or is deleted.
class ReflectorSink {
 public:
  virtual ~ReflectorSink() = default;
  virtual std::string_view kind() const = 0;
  virtual std::string_view path() const = 0;
  virtual void BeginList() = 0;
  // Decodes one list item into the pending list.
  virtual SinkOutcome AddListItem(std::string_view json, Decoder& decoder) = 0;
  virtual void CommitList(std::string resource_version) = 0;
  // ADDED/MODIFIED/DELETED; sets *rv to the object's resourceVersion when the identity decoded.
  virtual SinkOutcome ApplyEvent(EventType type, std::string_view object_json, Decoder& decoder,
                                 std::string* rv) = 0;
};

template <typename T>
class StoreSink : public ReflectorSink {
 public:
  explicit StoreSink(Store<T>* store) : store_(store) {}
  std::string_view kind() const override { return KindInfo<T>::kKind; }
  std::string_view path() const override { return KindInfo<T>::kPath; }
  void BeginList() override {
    pending_.clear();
    pending_refused_.clear();
  }
  SinkOutcome AddListItem(std::string_view json, Decoder& decoder) override {
    SinkOutcome out;
    T obj;
    out.decode_error = decoder.Decode(json, &obj);
    if (out.decode_error.ok()) {
      out.key = obj.meta.Key();
      out.applied = true;
      pending_.push_back(std::move(obj));
      return out;
    }
    ObjectMeta id;
    if (!decoder.DecodeIdentity(json, &id).ok()) return out;
    // Left out of the list, so Replace removes what an earlier version programmed.
    out.key = id.Key();
    out.applied = true;
    out.by_identity = true;
    out.first_report = Refused(out.key, out.decode_error);
    pending_refused_[out.key] = std::string(out.decode_error.message());
    return out;
  }
  void CommitList(std::string resource_version) override {
    store_->Replace(std::move(pending_), std::move(resource_version));
    pending_.clear();
    refused_ = std::move(pending_refused_);  // objects gone from the list are forgotten
    pending_refused_.clear();
  }
  SinkOutcome ApplyEvent(EventType type, std::string_view object_json, Decoder& decoder,
                         std::string* rv) override {
    SinkOutcome out;
    T obj;
    out.decode_error = decoder.Decode(object_json, &obj);
    if (out.decode_error.ok()) {
      out.key = obj.meta.Key();
      out.applied = true;
      *rv = obj.meta.resource_version;
      refused_.erase(out.key);
      if (type == EventType::kDeleted) {
        store_->Delete(obj);
      } else {
        store_->Upsert(std::move(obj));
      }
      return out;
    }
    T id;
    if (!decoder.DecodeIdentity(object_json, &id.meta).ok()) return out;
    out.key = id.meta.Key();
    out.applied = true;
    out.by_identity = true;
    *rv = id.meta.resource_version;
    if (type == EventType::kDeleted) {
      refused_.erase(out.key);
    } else {
      out.first_report = Refused(out.key, out.decode_error);
      refused_[out.key] = std::string(out.decode_error.message());
    }
    store_->Delete(id);
    return out;
  }

  // Objects currently refused (key -> decode error), for tests and status.
  size_t refused_objects() const { return refused_.size(); }

 private:
  bool Refused(const std::string& key, const absl::Status& error) const {
    auto it = refused_.find(key);
    return it == refused_.end() || it->second != error.message();
  }

  Store<T>* const store_;
  std::vector<T> pending_;
  absl::flat_hash_map<std::string, std::string> refused_;  // reflector thread only
  absl::flat_hash_map<std::string, std::string> pending_refused_;
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
  enum class Next {
    kWatch,
    kRewatchNow,
    kBackoffRewatch,
    kRelistNow,
    kBackoffRelist,
    kExpiredRelist,  // after 410 Gone: relist at once, or after expired_backoff_ (see the top)
    kStopped
  };

  void Run();
  Next List();
  Next Watch();
  bool BackoffSleep();
  bool WaitBeforeExpiredRelist();
  std::string Query(std::initializer_list<std::pair<std::string_view, std::string>> params) const;
  void SetLastRv(std::string rv);
  bool stopping() const { return stop_.HasBeenNotified(); }

  HttpClient* const http_;
  const std::unique_ptr<ReflectorSink> sink_;
  const ReflectorOptions opts_;
  const Clock* const clock_;
  const RandomFn random_;
  Backoff backoff_;
  // Relists after 410 Gone have a sequence of their own, so that the back-off of a cut stream
  // before the 410 does not lengthen the relist after it.
  Backoff expired_backoff_;
  bool expired_since_healthy_watch_ = false;  // a 410 relist went since the last healthy watch
  Decoder decoder_;  // reflector thread only
  Canceller canceller_;
  absl::Notification stop_;
  std::thread thread_;

  // Reflector thread state (client-go names).
  std::string last_sync_rv_;           // RV of the last completed list
  bool rv_unavailable_ = false;        // the last list got Expired/TooLarge: relist with RV=""
  bool unpaginated_next_ = false;      // a continue token expired twice in a row: list in one go
  bool continue_expired_ = false;
  bool unreachable_ = false;  // the last failure got no answer from the apiserver
  std::optional<absl::Duration> retry_after_;
  std::optional<absl::Time> internal_errors_since_;

  mutable absl::Mutex mu_;
  std::string last_rv_ ABSL_GUARDED_BY(mu_);

  struct AtomicCounters {
    std::atomic<uint64_t> lists{0}, list_pages{0}, list_items{0}, relists{0}, watches{0}, events{0},
        bookmarks{0}, expired{0}, decode_errors{0}, undecodable_deletes{0}, undecodable_removals{0},
        backoffs{0}, transport_errors{0}, http_errors{0}, short_watches{0};
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
