// The lab's kube-apiserver: the Kubernetes API subset Sluice and kubectl use (discovery, CRUD,
// patch, paginated list, watch with bookmarks) over HTTPS with bearer-token auth, backed by an
// ObjectStore with the lab controllers, plus fault injection for client tests (in-process and
// through the token-guarded admin endpoint POST /lab/faults).
#ifndef SLUICE_AGENT_LAB_APISERVER_APISERVER_H_
#define SLUICE_AGENT_LAB_APISERVER_APISERVER_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/lab/controllers/controllers.h"
#include "agent/lab/store/object_store.h"
#include "agent/lab/tools/kubeconfig.h"
#include "nlohmann/json.hpp"

namespace httplib {
class Server;
class Request;
class Response;
class DataSink;
}  // namespace httplib

namespace sluice::lab {

struct ApiServerOptions {
  std::string address = "127.0.0.1";
  int port = 0;                         // 0: ephemeral; see ApiServer::port()
  std::string token;                    // empty: a random one
  std::vector<std::string> extra_sans;  // more IP or DNS SANs for the serving certificate
  absl::Duration bookmark_interval = absl::Minutes(1);
  absl::Duration default_watch_timeout = absl::Minutes(30);  // when timeoutSeconds is absent
  size_t history_limit = 100'000;
  const Clock* clock = RealClock::Get();  // object timestamps and graceful deletion
  ControllerOptions controllers;
  bool run_controllers = true;
  int worker_threads = 256;  // every open watch holds one
  // PEM CA bundle: a request may authenticate with a client certificate signed by one of these
  // instead of the bearer token (kube-apiserver's --client-ca-file; a certificate from another
  // CA fails the TLS handshake). Empty: bearer token only.
  std::string client_ca_pem;
  // Keep the last this-many requests for ApiServer::requests() (0: no request log).
  size_t request_log_limit = 0;
  // Where the lab's kubelet writes each pod's output (<dir>/<namespace>_<name>.log), served as
  // the pods/log subresource (`kubectl logs`). Empty: pods have no logs (400, as for a pod whose
  // containers have not started).
  std::string pod_log_dir;
};

// One request as the server understood it (the query decoded), recorded before authentication.
struct RecordedRequest {
  std::string method;
  std::string path;
  std::multimap<std::string, std::string> params;
  std::string authorization;  // the Authorization header as sent ("" if none)

  bool watch() const;
  std::string param(const std::string& name) const;  // "" when absent
};

// How a watch from a resourceVersion older than the retained history (and FailNextWatches) is
// answered. kube-apiserver does both, depending on version and on whether the watch cache serves
// the request; a client must handle either.
enum class ExpiredWatchReply {
  kHttpStatus,  // HTTP 410 with a Status body
  kErrorEvent,  // HTTP 200 and one ERROR event carrying the 410 Status, then the stream ends
};

// How CutWatches ends the open watch streams. Either way the stream ends without the terminating
// chunk, so clients see a transfer error (curl: CURLE_PARTIAL_FILE), not a clean end.
struct WatchCut {
  bool mid_event = false;      // write the first half of an event's bytes, then close
  bool at_next_event = false;  // cut when each stream next has an event to send (that event is
                               // the torn one with mid_event, else it is not sent) instead of now
                               // (mid_event now: half of a BOOKMARK)
};

class ApiServer {
 public:
  explicit ApiServer(ApiServerOptions options);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Generates the CA and serving certificate, binds, bootstraps the default objects, starts the
  // controllers and serves on a background thread.
  absl::Status Start();
  void Stop();

  int port() const { return port_; }
  std::string url() const;  // https://ADDRESS:PORT
  const std::string& ca_cert_pem() const { return ca_cert_pem_; }
  std::string token() const;
  void SetToken(std::string token);  // rotation: the old token gets 401 from now on
  KubeconfigParams kubeconfig() const;
  absl::Status WriteKubeconfig(const std::string& path) const;

  ObjectStore& store() { return *store_; }
  Controllers& controllers() { return *controllers_; }

  // The retained request log, oldest first (ApiServerOptions::request_log_limit).
  std::vector<RecordedRequest> requests() const;
  int watch_requests() const;  // how many of those are watches

  // ---- faults ----
  void CutWatches(WatchCut cut = {});
  // The next watch request sends `events` events whole, then the first half of the next event's
  // bytes, then closes without the terminating chunk (bookmarks pass and are not counted).
  void CutNextWatchAfter(int events);
  // The open watch streams stop sending (they stay connected, send nothing, not even bookmarks)
  // until they are cut (CutWatches, GoAway: they then end at once, without what they held) or
  // reach their timeout (clean end). Watches opened later are not frozen.
  void FreezeWatches();
  // While on, every new watch is answered 200 and ends cleanly at once, with no event.
  void EndWatchesAtOnce(bool on);
  // The next `count` watch requests are answered 410 Expired (see SetExpiredWatchReply).
  void FailNextWatches(int count);
  void SetExpiredWatchReply(ExpiredWatchReply reply);  // default kHttpStatus
  // The next `count` list requests that carry a continue token get 410 Expired (the token's
  // snapshot is gone), as after a compaction.
  void ExpireNextContinues(int count);
  // List responses are written `chunk_bytes` at a time with `pause` before each piece (a slow or
  // far-away apiserver); chunk_bytes 0 turns it off.
  void SlowLists(size_t chunk_bytes, absl::Duration pause);
  // A BOOKMARK at the current resourceVersion on every open watch that allows bookmarks, now
  // instead of at the next bookmark_interval (once the events it has queued are sent).
  void SendBookmarks();
  // Requests arriving in the next `duration` are held until it has passed (not /lab/ ones).
  void Stall(absl::Duration duration);
  // Closes the listener (connections are refused) and ends every open stream. With
  // `come_back_after` the server listens again on the same port by itself; otherwise call
  // ComeBack(). Returns once the port is closed.
  void GoAway(std::optional<absl::Duration> come_back_after = std::nullopt);
  absl::Status ComeBack();
  bool serving() const;
  // Drops the watch history: watches from an older RV get 410 (SetExpiredWatchReply), continue
  // tokens expire, running watches get an in-stream ERROR 410 and end (frozen ones stay frozen).
  void Compact();

  int open_watches() const;

 private:
  struct ActiveWatch;
  absl::Status Listen();     // new httplib server on port_
  void Shutdown(bool wait);  // stop the current httplib server
  void InstallHandlers(httplib::Server& server);
  void Handle(const httplib::Request& req, httplib::Response& res);
  void HandleFaults(const httplib::Request& req, httplib::Response& res);
  void HandleWatch(const httplib::Request& req, httplib::Response& res, const ResourceType& type,
                   const std::string& ns);
  void HandleList(const httplib::Request& req, httplib::Response& res, const ResourceType& type,
                  const std::string& ns);
  void HandlePodLog(const httplib::Request& req, httplib::Response& res, const std::string& ns,
                    const std::string& name);
  void ReplyWatchExpired(httplib::Response& res, ExpiredWatchReply how, const std::string& message,
                         const ResourceType& type);
  // A frozen stream's wait; the content provider's result.
  bool HoldFrozen(ActiveWatch& watch, absl::Time deadline, httplib::DataSink& sink);
  void Record(const httplib::Request& req);
  bool ClientCertificateAccepted(const httplib::Request& req) const;
  void LifecycleLoop();
  void PostGoAway(std::optional<absl::Duration> come_back_after);

  ApiServerOptions options_;
  std::unique_ptr<ObjectStore> store_;
  std::unique_ptr<ServiceAdmission> admission_;
  std::unique_ptr<Controllers> controllers_;
  int port_ = 0;
  std::string ca_cert_pem_;
  std::string cert_pem_;
  std::string key_pem_;

  mutable std::mutex mu_;
  std::string token_;
  std::unique_ptr<httplib::Server> server_;
  std::thread server_thread_;
  std::set<std::shared_ptr<ActiveWatch>> watches_;
  uint64_t cut_generation_ = 0;
  WatchCut cut_;
  int fail_watches_ = 0;
  absl::Time stall_until_ = absl::InfinitePast();
  std::condition_variable stall_cv_;  // also paces SlowLists
  bool stopping_ = false;
  int cut_next_after_ = -1;
  std::condition_variable frozen_cv_;  // wakes frozen streams: a cut, a shutdown
  bool end_watches_at_once_ = false;
  ExpiredWatchReply expired_reply_ = ExpiredWatchReply::kHttpStatus;
  int expire_continues_ = 0;
  size_t slow_list_chunk_ = 0;
  absl::Duration slow_list_pause_;
  std::deque<RecordedRequest> requests_;

  // GoAway / ComeBack run on this thread (an admin request cannot stop its own server).
  std::thread lifecycle_thread_;
  std::condition_variable lifecycle_cv_;
  bool lifecycle_go_away_ = false;
  std::optional<absl::Time> come_back_at_;
  bool down_ = false;
  std::condition_variable down_cv_;
};

// kube-apiserver's metav1.Status for an error.
nlohmann::json StatusObject(int code, const std::string& reason, const std::string& message);

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_APISERVER_APISERVER_H_
