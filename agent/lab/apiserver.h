// The lab's kube-apiserver: the Kubernetes API subset Sluice and kubectl use (discovery, CRUD,
// patch, paginated list, watch with bookmarks) over HTTPS with bearer-token auth, backed by an
// ObjectStore with the lab controllers, plus fault injection for client tests (in-process and
// through the token-guarded admin endpoint POST /lab/faults).
#ifndef SLUICE_AGENT_LAB_APISERVER_H_
#define SLUICE_AGENT_LAB_APISERVER_H_

#include <atomic>
#include <condition_variable>
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
#include "agent/lab/controllers.h"
#include "agent/lab/kubeconfig.h"
#include "agent/lab/object_store.h"
#include "nlohmann/json.hpp"

namespace httplib {
class Server;
class Request;
class Response;
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

  // ---- faults ----
  void CutWatches(WatchCut cut = {});
  // The next `count` watch requests get HTTP 410 Expired.
  void FailNextWatches(int count);
  // Requests arriving in the next `duration` are held until it has passed (not /lab/ ones).
  void Stall(absl::Duration duration);
  // Closes the listener (connections are refused) and ends every open stream. With
  // `come_back_after` the server listens again on the same port by itself; otherwise call
  // ComeBack(). Returns once the port is closed.
  void GoAway(std::optional<absl::Duration> come_back_after = std::nullopt);
  absl::Status ComeBack();
  bool serving() const;
  // Drops the watch history: watches from an older RV get HTTP 410, running watches get an
  // in-stream ERROR 410 and end.
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
  std::condition_variable stall_cv_;
  bool stopping_ = false;

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

#endif  // SLUICE_AGENT_LAB_APISERVER_H_
