// Watch streaming: one chunked response per watch, fed from an ObjectStore WatchStream, with
// periodic and initial-events-end bookmarks, in-stream 410 on compaction, and the cut faults.
#include <httplib.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/apiserver/internal.h"
#include "agent/lab/apiserver/tables.h"

namespace sluice::lab {

using nlohmann::json;

void ApiServer::HandleWatch(const httplib::Request& req, httplib::Response& res,
                            const ResourceType& type, const std::string& ns) {
  WatchOptions opts;
  opts.namespace_name = ns;
  if (!ParseSelectors(req, type, res, &opts.labels, &opts.fields)) return;
  std::string rv = req.get_param_value("resourceVersion");
  bool send_initial = ParamTrue(req, "sendInitialEvents");
  bool bookmarks = ParamTrue(req, "allowWatchBookmarks");
  if (send_initial && req.get_param_value("resourceVersionMatch") != "NotOlderThan") {
    return ReplyStatus(res, 422, "Invalid",
                       "sendInitialEvents is forbidden unless resourceVersionMatch is "
                       "NotOlderThan");
  }
  if (!send_initial && !rv.empty() && rv != "0") {
    uint64_t since = 0;
    if (!absl::SimpleAtoi(rv, &since)) {
      return ReplyStatus(res, 400, "BadRequest", absl::StrCat("invalid resource version: ", rv));
    }
    opts.since = since;
  }
  absl::Duration timeout = options_.default_watch_timeout;
  int64_t seconds = 0;
  if (req.has_param("timeoutSeconds") &&
      absl::SimpleAtoi(req.get_param_value("timeoutSeconds"), &seconds) && seconds > 0) {
    timeout = absl::Seconds(seconds);
  }
  ExpiredWatchReply expired_reply;
  bool end_at_once;
  {
    std::lock_guard<std::mutex> lock(mu_);
    expired_reply = expired_reply_;
    end_at_once = end_watches_at_once_;
    if (fail_watches_ > 0) {
      --fail_watches_;
      return ReplyWatchExpired(res, expired_reply,
                               absl::StrCat("too old resource version: ", rv.empty() ? "0" : rv,
                                            " (", store_->CurrentResourceVersion(), ")"),
                               type);
    }
  }
  uint64_t start_rv = store_->CurrentResourceVersion();
  auto stream = store_->Watch(type, opts);
  if (!stream.ok()) {
    if (stream.status().code() == absl::StatusCode::kOutOfRange) {
      return ReplyWatchExpired(res, expired_reply, std::string(stream.status().message()), type);
    }
    return ReplyError(res, stream.status(), &type);
  }
  if (end_at_once) {
    res.status = 200;
    res.set_chunked_content_provider(kJson, [](size_t, httplib::DataSink& sink) {
      sink.done();
      return true;
    });
    return;
  }
  auto watch = std::make_shared<ActiveWatch>();
  watch->stream = std::move(*stream);
  size_t initial = send_initial ? watch->stream->queued() : 0;
  int cut_after = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watch->cut_generation = cut_generation_;
    watches_.insert(watch);
    cut_after = cut_next_after_;
    cut_next_after_ = -1;
  }

  struct StreamState {
    absl::Time deadline;
    absl::Time next_bookmark;
    size_t initial_left;
    bool initial_bookmark_pending;
    uint64_t start_rv;
    std::optional<WatchCut> pending_cut;
    bool bookmarks;
    bool bookmark_requested = false;  // SendBookmarks, waiting for the queue to drain
    int cut_after;                    // CutNextWatchAfter: events to send before the torn one
    int sent = 0;                     // events (not bookmarks) written
  };
  auto st = std::make_shared<StreamState>();
  st->deadline = absl::Now() + timeout;
  st->next_bookmark = bookmarks ? absl::Now() + options_.bookmark_interval : absl::InfiniteFuture();
  st->initial_left = initial;
  st->initial_bookmark_pending = send_initial && bookmarks;
  st->start_rv = start_rv;
  st->bookmarks = bookmarks;
  st->cut_after = cut_after;
  const ResourceType* t = &type;
  // `kubectl get -w` asks for Tables: each event's object is then a one-row Table.
  std::optional<TableRequest> table =
      TableRequested(req.get_header_value("Accept"), req.get_param_value("includeObject"));

  auto bookmark = [t](uint64_t rv, bool initial_end) {
    json obj = {{"kind", t->kind},
                {"apiVersion", t->ApiVersion()},
                {"metadata", {{"resourceVersion", std::to_string(rv)}}}};
    if (initial_end) obj["metadata"]["annotations"] = {{"k8s.io/initial-events-end", "true"}};
    return EventLine("BOOKMARK", obj);
  };

  res.status = 200;
  res.set_chunked_content_provider(
      kJson,
      [this, watch, st, bookmark, t, table](size_t, httplib::DataSink& sink) -> bool {
        std::string batch;
        auto flush = [&]() -> bool {
          if (batch.empty()) return true;
          bool ok = sink.write(batch.data(), batch.size());
          batch.clear();
          return ok;
        };
        while (true) {
          if (watch->shutdown) return false;
          // Frozen: what this stream holds (even `batch`) is never sent; it only ends.
          if (watch->frozen) return HoldFrozen(*watch, st->deadline, sink);
          if (st->initial_left == 0 && st->initial_bookmark_pending) {
            st->initial_bookmark_pending = false;
            batch += bookmark(st->start_rv, true);
            return flush();
          }
          if (st->bookmark_requested && batch.empty()) {
            // As for the periodic bookmark: rv first, then an empty queue means nothing below it
            // is unsent.
            uint64_t rv = store_->CurrentResourceVersion();
            if (watch->stream->queued() == 0) {
              st->bookmark_requested = false;
              batch += bookmark(rv, false);
              return flush();
            }
          }
          absl::Time wake = std::min(st->deadline, st->next_bookmark);
          if (!batch.empty()) wake = absl::InfinitePast();  // only drain what is queued
          Event ev;
          WatchStream::Result r = watch->stream->Next(wake, &ev);
          if (r == WatchStream::Result::kEvent) {
            if (watch->frozen) return HoldFrozen(*watch, st->deadline, sink);
            if (st->initial_left > 0) --st->initial_left;
            std::string line =
                table ? EventLine(EventTypeName(ev.type),
                                  TableOf(*t, {ev.object}, *table, store_->clock()->Now(),
                                          (*ev.object)["metadata"].value("resourceVersion", "")))
                      : EventLine(EventTypeName(ev.type), *ev.object);
            if (st->cut_after >= 0 && st->sent == st->cut_after) {
              if (!flush()) return false;
              std::string half = line.substr(0, line.size() / 2);
              sink.write(half.data(), half.size());
              return false;
            }
            ++st->sent;
            if (st->pending_cut) {
              if (!flush()) return false;
              if (st->pending_cut->mid_event) {
                std::string half = line.substr(0, line.size() / 2);
                sink.write(half.data(), half.size());
              }
              return false;
            }
            batch += line;
            if (batch.size() > 64 * 1024) return flush();
            continue;
          }
          if (r == WatchStream::Result::kExpired) {
            if (!flush()) return false;
            std::string line = EventLine(
                "ERROR",
                StatusObject(410, "Expired",
                             absl::StrCat("too old resource version: the watch history was "
                                          "compacted at ",
                                          store_->OldestWatchableResourceVersion())));
            sink.write(line.data(), line.size());
            sink.done();
            return true;
          }
          if (r == WatchStream::Result::kInterrupted) {
            if (watch->shutdown) return false;
            if (watch->bookmark_now.exchange(false) && st->bookmarks) {
              st->bookmark_requested = true;
            }
            std::optional<WatchCut> cut;
            {
              std::lock_guard<std::mutex> lock(mu_);
              if (cut_generation_ != watch->cut_generation) {
                watch->cut_generation = cut_generation_;
                cut = cut_;
              }
            }
            if (!cut) continue;
            if (!flush()) return false;
            if (cut->at_next_event) {
              st->pending_cut = cut;
              continue;
            }
            if (cut->mid_event) {
              std::string line = bookmark(store_->CurrentResourceVersion(), false);
              std::string half = line.substr(0, line.size() / 2);
              sink.write(half.data(), half.size());
            }
            return false;
          }
          // kTimeout: drained what was queued, or a deadline.
          if (!batch.empty()) return flush();
          absl::Time now = absl::Now();
          if (now >= st->deadline) {
            if (st->next_bookmark != absl::InfiniteFuture()) {
              uint64_t rv = store_->CurrentResourceVersion();
              if (watch->stream->queued() == 0) batch += bookmark(rv, false);
            }
            if (!flush()) return false;
            sink.done();
            return true;
          }
          if (now >= st->next_bookmark) {
            st->next_bookmark = now + options_.bookmark_interval;
            // Every event up to rv has been queued (under the store lock) before rv is visible;
            // with an empty queue they have all been sent, so the bookmark cannot skip one.
            uint64_t rv = store_->CurrentResourceVersion();
            if (watch->stream->queued() == 0) {
              batch += bookmark(rv, false);
              return flush();
            }
          }
        }
      },
      [this, watch](bool) {
        std::lock_guard<std::mutex> lock(mu_);
        watches_.erase(watch);
      });
}

bool ApiServer::HoldFrozen(ActiveWatch& watch, absl::Time deadline, httplib::DataSink& sink) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!watch.shutdown && !stopping_ && cut_generation_ == watch.cut_generation) {
    if (absl::Now() >= deadline) {
      lock.unlock();
      sink.done();  // the watch's timeout: a clean end, the client re-watches
      return true;
    }
    frozen_cv_.wait_for(lock, absl::ToChronoNanoseconds(deadline - absl::Now()));
  }
  return false;  // cut or shut down: the connection drops with what the stream held
}

void ApiServer::ReplyWatchExpired(httplib::Response& res, ExpiredWatchReply how,
                                  const std::string& message, const ResourceType& type) {
  if (how == ExpiredWatchReply::kHttpStatus) {
    return ReplyError(res, absl::OutOfRangeError(message), &type);
  }
  auto line =
      std::make_shared<std::string>(EventLine("ERROR", StatusObject(410, "Expired", message)));
  res.status = 200;
  res.set_chunked_content_provider(kJson, [line](size_t, httplib::DataSink& sink) {
    sink.write(line->data(), line->size());
    sink.done();
    return true;
  });
}

}  // namespace sluice::lab
