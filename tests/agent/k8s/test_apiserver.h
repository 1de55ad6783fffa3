// A small HTTPS apiserver for the k8s client tests: one collection (Services), the real list/watch
// protocol (paginated lists with continue tokens, chunked watch streams from a resourceVersion,
// bookmarks, 410 Expired as HTTP status or ERROR event) and the faults the reflector must survive.
// Certificates come from the openssl CLI in a temp dir. Loopback only.
#pragma once

#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#include <httplib.h>
#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace sluice::k8s::testing {

inline void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A temp directory removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "sluice-k8s-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A CA, a server certificate for 127.0.0.1 signed by it, a client certificate, and an unrelated
// CA (for verification failures).
struct TestCerts {
  TempDir dir;
  std::string ca_crt, server_crt, server_key, client_crt, client_key, other_ca_crt;

  TestCerts() {
    const std::string d = dir.path();
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    WriteFile(d + "/ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    const std::string script = absl::StrCat(
        "set -e; cd ", d, "; ",
        "openssl req -x509 ", ec, " -keyout ca.key -out ca.crt -days 2 -subj /CN=sluice-test-ca; ",
        "openssl req -x509 ", ec, " -keyout other.key -out other.crt -days 2 -subj /CN=other; ",
        "openssl req ", ec, " -keyout server.key -out server.csr -subj /CN=127.0.0.1; ",
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial ",
        "-out server.crt -days 2 -extfile ext; ",
        "openssl req ", ec, " -keyout client.key -out client.csr -subj /CN=system:node:n1; ",
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial ",
        "-out client.crt -days 2");
    const std::string cmd = "bash -c '" + script + "' >" + d + "/openssl.log 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << ReadAll(d + "/openssl.log");
    ca_crt = d + "/ca.crt";
    server_crt = d + "/server.crt";
    server_key = d + "/server.key";
    client_crt = d + "/client.crt";
    client_key = d + "/client.key";
    other_ca_crt = d + "/other.crt";
  }
};

class TestApiServer {
 public:
  static constexpr char kPath[] = "/api/v1/services";

  struct Request {
    std::string path;
    std::multimap<std::string, std::string> params;
    std::string authorization;
    bool watch() const { return params.count("watch") > 0; }
    std::string param(const std::string& k) const {
      auto it = params.find(k);
      return it == params.end() ? "" : it->second;
    }
  };

  explicit TestApiServer(const TestCerts& certs, bool require_client_cert = false)
      : certs_(certs), require_client_cert_(require_client_cert) {}
  ~TestApiServer() { Stop(); }

  // Binds 127.0.0.1 (`port` 0 = any free port) and serves in a thread.
  void Start(int port = 0) {
    svr_ = std::make_unique<httplib::SSLServer>(
        certs_.server_crt.c_str(), certs_.server_key.c_str(),
        require_client_cert_ ? certs_.ca_crt.c_str() : nullptr);
    ASSERT_TRUE(svr_->is_valid());
    svr_->Get(kPath, [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res);
    });
    if (port == 0) {
      port_ = svr_->bind_to_any_port("127.0.0.1");
    } else {
      ASSERT_TRUE(svr_->bind_to_port("127.0.0.1", port));
      port_ = port;
    }
    ASSERT_GT(port_, 0);
    {
      absl::MutexLock lock(&mu_);
      stopping_ = false;
    }
    thread_ = std::thread([this] { svr_->listen_after_bind(); });
    // httplib's stop() is a no-op until the accept loop runs; wait for it (deadline-bounded).
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (!svr_->is_running() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_TRUE(svr_->is_running());
  }

  void Stop() {
    if (!svr_) return;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    svr_->stop();
    if (thread_.joinable()) thread_.join();
    svr_.reset();
  }

  int port() const { return port_; }
  std::string url() const { return absl::StrCat("https://127.0.0.1:", port_); }

  // --- state -------------------------------------------------------------------------------
  // Creates or updates default/<name> with a port value (distinguishes versions); new uid on
  // create or when `uid` is given. Returns the new resourceVersion.
  std::string Upsert(const std::string& name, int port, std::string uid = "") {
    absl::MutexLock lock(&mu_);
    const bool exists = objects_.count(name) > 0;
    if (uid.empty()) uid = exists ? objects_[name].uid : absl::StrCat("uid-", name, "-", ++uids_);
    Object& o = objects_[name];
    o.uid = uid;
    o.port = port;
    o.rv = ++rv_;
    history_.push_back({o.rv, exists ? "MODIFIED" : "ADDED", Json(name, o)});
    return absl::StrCat(o.rv);
  }
  std::string Remove(const std::string& name) {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(name);
    if (it == objects_.end()) return "";
    Object o = it->second;
    objects_.erase(it);
    o.rv = ++rv_;
    history_.push_back({o.rv, "DELETED", Json(name, o)});
    return absl::StrCat(o.rv);
  }
  // A BOOKMARK at a fresh resourceVersion (no object change) on every open watch.
  std::string Bookmark() {
    absl::MutexLock lock(&mu_);
    ++rv_;
    history_.push_back({rv_, "BOOKMARK",
                        absl::StrCat(R"({"kind":"Service","apiVersion":"v1","metadata":{)",
                                     R"("resourceVersion":")", rv_, R"("}})")});
    return absl::StrCat(rv_);
  }
  std::string resource_version() const {
    absl::MutexLock lock(&mu_);
    return absl::StrCat(rv_);
  }
  // name -> port of the current objects.
  std::map<std::string, int> Snapshot() const {
    absl::MutexLock lock(&mu_);
    std::map<std::string, int> out;
    for (const auto& [n, o] : objects_) out[n] = o.port;
    return out;
  }

  // --- faults ------------------------------------------------------------------------------
  // Open watches stop delivering (changes made now are not seen until a reconnect).
  void FreezeWatches() {
    absl::MutexLock lock(&mu_);
    frozen_ = true;
  }
  // Forgets all history up to now (a watch from an older RV gets 410) and drops open watches.
  void CompactAndDisconnect() {
    absl::MutexLock lock(&mu_);
    history_floor_ = rv_;
    history_.clear();
    frozen_ = false;
    ++generation_;
  }
  // Drops open watch connections (no terminating chunk).
  void Disconnect() {
    absl::MutexLock lock(&mu_);
    frozen_ = false;
    ++generation_;
  }
  // The next watch delivers `n` events, then half of the next one, then closes the connection.
  void CutNextWatchAfter(int n) {
    absl::MutexLock lock(&mu_);
    cut_after_ = n;
  }
  // Too-old watches get HTTP 410 instead of 200 + ERROR event.
  void set_expired_as_http(bool v) {
    absl::MutexLock lock(&mu_);
    expired_as_http_ = v;
  }
  // Every watch ends cleanly at once with no event.
  void set_close_watches_at_once(bool v) {
    absl::MutexLock lock(&mu_);
    close_at_once_ = v;
  }
  // Lists are sent in `chunk` byte pieces with `pause` between them.
  void set_slow_list(size_t chunk, absl::Duration pause) {
    absl::MutexLock lock(&mu_);
    slow_chunk_ = chunk;
    slow_pause_ = pause;
  }
  // Requests must carry "Authorization: Bearer <token>" ("" = no check).
  void set_required_token(const std::string& token) {
    absl::MutexLock lock(&mu_);
    token_ = token;
  }
  // The next `n` continue requests fail with 410 Expired.
  void ExpireNextContinues(int n) {
    absl::MutexLock lock(&mu_);
    expire_continues_ = n;
  }

  std::vector<Request> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  int watch_requests() const {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& r : requests_) n += r.watch();
    return n;
  }
  int open_watches() const {
    absl::MutexLock lock(&mu_);
    return open_watches_;
  }
  bool WaitOpenWatches(int n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto cond = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_watches_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
  }

 private:
  struct Object {
    std::string uid;
    int port = 0;
    uint64_t rv = 0;
  };
  struct Event {
    uint64_t rv;
    std::string type;
    std::string object;
  };

  static std::string Json(const std::string& name, const Object& o) {
    return absl::StrCat(R"({"metadata":{"name":")", name, R"(","namespace":"default","uid":")",
                        o.uid, R"(","resourceVersion":")", o.rv,
                        R"(","managedFields":[{"manager":"x"}]},"spec":{"type":"ClusterIP",)",
                        R"("clusterIP":"10.96.0.1","ports":[{"name":"p","port":)", o.port,
                        R"(,"protocol":"TCP","targetPort":8080}]},"status":{}})");
  }

  static std::string StatusJson(int code, const std::string& reason, const std::string& msg) {
    return absl::StrCat(R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)",
                        R"("message":")", msg, R"(","reason":")", reason, R"(","code":)", code,
                        "}");
  }

  static void Fail(httplib::Response& res, int code, const std::string& reason,
                   const std::string& msg) {
    res.status = code;
    res.set_content(StatusJson(code, reason, msg), "application/json");
  }

  void Handle(const httplib::Request& req, httplib::Response& res) {
    Request r{req.path, {req.params.begin(), req.params.end()},
              req.get_header_value("Authorization")};
    std::string token;
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(r);
      token = token_;
    }
    if (!token.empty() && r.authorization != "Bearer " + token) {
      return Fail(res, 401, "Unauthorized", "Unauthorized");
    }
    if (r.watch()) return HandleWatch(r, res);
    return HandleList(r, res);
  }

  void HandleList(const Request& r, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    size_t limit = 0;
    if (!r.param("limit").empty()) (void)absl::SimpleAtoi(r.param("limit"), &limit);
    std::shared_ptr<Snap> snap;
    size_t offset = 0;
    if (const std::string cont = r.param("continue"); !cont.empty()) {
      if (expire_continues_ > 0) {
        --expire_continues_;
        return Fail(res, 410, "Expired", "The provided continue parameter is too old");
      }
      const size_t colon = cont.find(':');
      size_t id = 0;
      if (colon == std::string::npos || !absl::SimpleAtoi(cont.substr(0, colon), &id) ||
          !absl::SimpleAtoi(cont.substr(colon + 1), &offset) || !snaps_.count(id)) {
        return Fail(res, 400, "BadRequest", "bad continue");
      }
      snap = snaps_[id];
    } else {
      snap = std::make_shared<Snap>();
      snap->rv = rv_;
      for (const auto& [name, o] : objects_) snap->items.push_back(Json(name, o));
      snaps_[++snap_ids_] = snap;
      snap->id = snap_ids_;
    }
    const size_t end = limit == 0 ? snap->items.size() : std::min(snap->items.size(), offset + limit);
    std::string cont_out = end < snap->items.size() ? absl::StrCat(snap->id, ":", end) : "";
    std::string body = absl::StrCat(R"({"kind":"ServiceList","apiVersion":"v1","metadata":{)",
                                    R"("resourceVersion":")", snap->rv, R"(")");
    if (!cont_out.empty()) absl::StrAppend(&body, R"(,"continue":")", cont_out, R"(")");
    absl::StrAppend(&body, R"(},"items":[)");
    for (size_t i = offset; i < end; ++i) {
      if (i > offset) body += ",";
      body += snap->items[i];
    }
    body += "]}";
    if (slow_chunk_ == 0) {
      res.set_content(body, "application/json");
      return;
    }
    const size_t chunk = slow_chunk_;
    const absl::Duration pause = slow_pause_;
    auto shared = std::make_shared<std::string>(std::move(body));
    res.set_chunked_content_provider(
        "application/json", [shared, chunk, pause](size_t offset, httplib::DataSink& sink) {
          if (offset >= shared->size()) {
            sink.done();
            return true;
          }
          absl::SleepFor(pause);  // the server being slow, not test synchronisation
          const size_t n = std::min(chunk, shared->size() - offset);
          return sink.write(shared->data() + offset, n);
        });
  }

  void HandleWatch(const Request& r, httplib::Response& res) {
    uint64_t from = 0;
    const std::string rv = r.param("resourceVersion");
    int timeout_s = 0;
    (void)absl::SimpleAtoi(r.param("timeoutSeconds"), &timeout_s);
    absl::MutexLock lock(&mu_);
    if (!rv.empty() && !absl::SimpleAtoi(rv, &from)) {
      return Fail(res, 400, "BadRequest", "bad resourceVersion");
    }
    if (from < history_floor_) {
      const std::string msg = absl::StrCat("too old resource version: ", from, " (",
                                           history_floor_, ")");
      if (expired_as_http_) return Fail(res, 410, "Expired", msg);
      auto body = std::make_shared<std::string>(absl::StrCat(
          R"({"type":"ERROR","object":)", StatusJson(410, "Expired", msg), "}\n"));
      res.set_chunked_content_provider(
          "application/json", [body](size_t offset, httplib::DataSink& sink) {
            if (offset == 0) sink.write(body->data(), body->size());
            sink.done();
            return true;
          });
      return;
    }
    if (close_at_once_) {
      res.set_chunked_content_provider("application/json",
                                       [](size_t, httplib::DataSink& sink) {
                                         sink.done();
                                         return true;
                                       });
      return;
    }
    auto st = std::make_shared<WatchState>();
    st->from = from;
    st->generation = generation_;
    st->cut_after = cut_after_;
    cut_after_ = -1;
    st->deadline = absl::Now() + absl::Seconds(timeout_s > 0 ? timeout_s : 3600);
    ++open_watches_;
    res.set_chunked_content_provider(
        "application/json",
        [this, st](size_t, httplib::DataSink& sink) { return WatchStep(*st, sink); },
        [this](bool) {
          absl::MutexLock lock(&mu_);
          --open_watches_;
        });
  }

  struct WatchState {
    uint64_t from = 0;
    uint64_t generation = 0;
    int cut_after = -1;
    int sent = 0;
    absl::Time deadline;
  };

  // One step of a watch stream: send pending events, or wait a little for new ones.
  bool WatchStep(WatchState& st, httplib::DataSink& sink) {
    std::vector<std::string> out;
    bool cut = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_ || generation_ != st.generation) return true;
        if (frozen_) return false;
        return !history_.empty() && history_.back().rv > st.from;
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(50));
      if (stopping_ || generation_ != st.generation) return false;  // drop the connection
      if (absl::Now() >= st.deadline) {
        sink.done();  // clean end: terminating chunk
        return true;
      }
      if (frozen_) return true;
      for (const Event& e : history_) {
        if (e.rv <= st.from) continue;
        std::string line =
            absl::StrCat(R"({"type":")", e.type, R"(","object":)", e.object, "}\n");
        if (st.cut_after >= 0 && st.sent == st.cut_after) {
          out.push_back(line.substr(0, line.size() / 2));
          cut = true;
          break;
        }
        out.push_back(std::move(line));
        st.from = e.rv;
        ++st.sent;
      }
    }
    for (const std::string& line : out) {
      if (!sink.write(line.data(), line.size())) return false;
    }
    return !cut;
  }

  struct Snap {
    size_t id = 0;
    uint64_t rv = 0;
    std::vector<std::string> items;
  };

  const TestCerts& certs_;
  const bool require_client_cert_;
  std::unique_ptr<httplib::SSLServer> svr_;
  std::thread thread_;
  int port_ = 0;

  mutable absl::Mutex mu_;
  bool stopping_ = false;
  uint64_t rv_ = 100;
  uint64_t uids_ = 0;
  uint64_t history_floor_ = 0;
  uint64_t generation_ = 0;
  std::map<std::string, Object> objects_;
  std::vector<Event> history_;
  std::map<size_t, std::shared_ptr<Snap>> snaps_;
  size_t snap_ids_ = 0;
  bool frozen_ = false;
  int cut_after_ = -1;
  bool expired_as_http_ = false;
  bool close_at_once_ = false;
  size_t slow_chunk_ = 0;
  absl::Duration slow_pause_;
  std::string token_;
  int expire_continues_ = 0;
  int open_watches_ = 0;
  std::vector<Request> requests_;
};

}  // namespace sluice::k8s::testing
