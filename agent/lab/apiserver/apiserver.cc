// The lab apiserver's lifecycle (certificates, listen, go away and come back), authentication
// and the request-level faults; the endpoints live in discovery.cc, handlers.cc and watch.cc.
#include "agent/lab/apiserver/apiserver.h"

#include <httplib.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/lab/apiserver/internal.h"
#include "agent/lab/tools/tls.h"
#include "spdlog/spdlog.h"

namespace sluice::lab {

using nlohmann::json;

namespace {

std::string RandomToken() {
  absl::BitGen gen;
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string t;
  for (int i = 0; i < 32; ++i) t.push_back(kChars[absl::Uniform(gen, 0u, 36u)]);
  return t;
}

}  // namespace

ApiServer::ApiServer(ApiServerOptions options) : options_(std::move(options)) {
  ObjectStore::Options so;
  so.history_limit = options_.history_limit;
  so.clock = options_.clock;
  store_ = std::make_unique<ObjectStore>(so);
  auto admission = ServiceAdmission::Create(options_.controllers);
  if (admission.ok()) {
    admission_ = std::move(*admission);
    store_->SetAdmission(admission_.get());
  } else {
    spdlog::error("lab apiserver: {}", admission.status().ToString());
  }
  controllers_ = std::make_unique<Controllers>(store_.get(), options_.controllers);
  token_ = options_.token.empty() ? RandomToken() : options_.token;
}

ApiServer::~ApiServer() { Stop(); }

std::string ApiServer::url() const {
  return absl::StrCat("https://", options_.address, ":", port_);
}

std::string ApiServer::token() const {
  std::lock_guard<std::mutex> lock(mu_);
  return token_;
}

void ApiServer::SetToken(std::string token) {
  std::lock_guard<std::mutex> lock(mu_);
  token_ = std::move(token);
}

KubeconfigParams ApiServer::kubeconfig() const {
  KubeconfigParams p;
  p.server = url();
  p.ca_cert_pem = ca_cert_pem_;
  p.token = token();
  return p;
}

absl::Status ApiServer::WriteKubeconfig(const std::string& path) const {
  return sluice::lab::WriteKubeconfig(path, kubeconfig());
}

absl::Status ApiServer::Start() {
  if (admission_ == nullptr) return absl::InvalidArgumentError("bad service CIDR");
  std::vector<std::string> ips = {"127.0.0.1"};
  std::vector<std::string> dns = {"localhost", "kubernetes", "kubernetes.default",
                                  "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"};
  auto is_ip = [](const std::string& s) {
    return ParseIpv4(s).ok() || s.find(':') != std::string::npos;
  };
  if (options_.address != "127.0.0.1" && is_ip(options_.address)) ips.push_back(options_.address);
  if (auto cidr = ParseIpv4Cidr(options_.controllers.service_cidr); cidr.ok()) {
    ips.push_back(FormatIpv4(cidr->first + 1));
  }
  for (const std::string& s : options_.extra_sans) (is_ip(s) ? ips : dns).push_back(s);
  auto creds = GenerateServingCredentials(ips, dns);
  if (!creds.ok()) return creds.status();
  ca_cert_pem_ = creds->ca_cert_pem;
  cert_pem_ = creds->cert_pem;
  key_pem_ = creds->key_pem;

  port_ = options_.port;
  if (absl::Status s = Listen(); !s.ok()) return s;
  if (absl::Status s =
          Controllers::Bootstrap(store_.get(), options_.controllers, options_.address, port_);
      !s.ok()) {
    return s;
  }
  if (options_.run_controllers) {
    if (absl::Status s = controllers_->Start(); !s.ok()) return s;
  }
  lifecycle_thread_ = std::thread([this] { LifecycleLoop(); });
  spdlog::info("lab apiserver: serving on {}", url());
  return absl::OkStatus();
}

void ApiServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  lifecycle_cv_.notify_all();
  stall_cv_.notify_all();
  frozen_cv_.notify_all();
  if (lifecycle_thread_.joinable()) lifecycle_thread_.join();
  Shutdown(true);
  controllers_->Stop();
}

absl::Status ApiServer::Listen() {
  auto load = [](const std::string& pem, bool key) -> void* {
    BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
    void* out = key ? static_cast<void*>(PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr))
                    : static_cast<void*>(PEM_read_bio_X509(bio, nullptr, nullptr, nullptr));
    BIO_free(bio);
    return out;
  };
  X509* cert = static_cast<X509*>(load(cert_pem_, false));
  EVP_PKEY* key = static_cast<EVP_PKEY*>(load(key_pem_, true));
  if (cert == nullptr || key == nullptr) return absl::InternalError("load serving certificate");
  auto server = std::make_unique<httplib::SSLServer>(cert, key);
  X509_free(cert);
  EVP_PKEY_free(key);
  if (!server->is_valid()) return absl::InternalError("TLS server setup failed");
  if (!options_.client_ca_pem.empty()) {
    // Ask for a client certificate but let clients without one through to token authentication
    // (Go's VerifyClientCertIfGiven, as kube-apiserver does).
    X509_STORE* cas = X509_STORE_new();
    BIO* bio = BIO_new_mem_buf(options_.client_ca_pem.data(),
                               static_cast<int>(options_.client_ca_pem.size()));
    int loaded = 0;
    while (X509* ca = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
      loaded += X509_STORE_add_cert(cas, ca);
      X509_free(ca);
    }
    BIO_free(bio);
    if (loaded == 0) {
      X509_STORE_free(cas);
      return absl::InvalidArgumentError("client_ca_pem holds no certificate");
    }
    SSL_CTX_set_cert_store(server->ssl_context(), cas);  // the context owns it now
    SSL_CTX_set_verify(server->ssl_context(), SSL_VERIFY_PEER, nullptr);
  }
  int threads = options_.worker_threads;
  server->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // Like kube-apiserver: small writes (watch events, a PUT's answer) go out at once, not after
  // Nagle's delay.
  server->set_tcp_nodelay(true);
  server->set_keep_alive_max_count(1000);
  server->set_keep_alive_timeout(2);
  server->set_read_timeout(10);
  server->set_write_timeout(10);
  InstallHandlers(*server);
  int port = port_;
  if (port == 0) {
    port = server->bind_to_any_port(options_.address);
    if (port <= 0) return absl::UnavailableError(absl::StrCat("bind ", options_.address, ":0"));
  } else if (!server->bind_to_port(options_.address, port)) {
    return absl::UnavailableError(absl::StrCat("bind ", options_.address, ":", port));
  }
  port_ = port;
  httplib::Server* raw = server.get();
  {
    std::lock_guard<std::mutex> lock(mu_);
    server_ = std::move(server);
    server_thread_ = std::thread([raw] { raw->listen_after_bind(); });
  }
  // httplib's stop() is a no-op until the accept loop runs: wait for it, so a GoAway() or Stop()
  // right after this can never leave a listener behind (or a join that never returns).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!raw->is_running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  if (!raw->is_running()) return absl::InternalError("lab apiserver: listener did not start");
  std::lock_guard<std::mutex> lock(mu_);
  down_ = false;
  return absl::OkStatus();
}

void ApiServer::Shutdown(bool wait) {
  std::unique_ptr<httplib::Server> server;
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    server = std::move(server_);
    thread = std::move(server_thread_);
    for (const auto& w : watches_) {
      w->shutdown = true;
      w->stream->Interrupt();
    }
  }
  stall_cv_.notify_all();
  frozen_cv_.notify_all();
  if (server != nullptr) {
    server->stop();
    if (thread.joinable()) thread.join();
  }
  // "Down" only once the listener is closed: GoAway() returns when connections are refused.
  {
    std::lock_guard<std::mutex> lock(mu_);
    down_ = true;
  }
  down_cv_.notify_all();
  (void)wait;
}

bool ApiServer::serving() const {
  std::lock_guard<std::mutex> lock(mu_);
  return server_ != nullptr;
}

int ApiServer::open_watches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(watches_.size());
}

void ApiServer::CutWatches(WatchCut cut) {
  std::lock_guard<std::mutex> lock(mu_);
  ++cut_generation_;
  cut_ = cut;
  for (const auto& w : watches_) w->stream->Interrupt();
  frozen_cv_.notify_all();
  spdlog::info("lab fault: cut {} watch streams (mid_event={}, at_next_event={})", watches_.size(),
               cut.mid_event, cut.at_next_event);
}

void ApiServer::CutNextWatchAfter(int events) {
  std::lock_guard<std::mutex> lock(mu_);
  cut_next_after_ = events;
}

void ApiServer::FreezeWatches() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : watches_) {
    w->frozen = true;
    w->stream->Interrupt();  // a stream blocked waiting for events notices at once
  }
  spdlog::info("lab fault: froze {} watch streams", watches_.size());
}

void ApiServer::EndWatchesAtOnce(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  end_watches_at_once_ = on;
}

void ApiServer::FailNextWatches(int count) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_watches_ = count;
}

void ApiServer::SetExpiredWatchReply(ExpiredWatchReply reply) {
  std::lock_guard<std::mutex> lock(mu_);
  expired_reply_ = reply;
}

void ApiServer::ExpireNextContinues(int count) {
  std::lock_guard<std::mutex> lock(mu_);
  expire_continues_ = count;
}

void ApiServer::SlowLists(size_t chunk_bytes, absl::Duration pause) {
  std::lock_guard<std::mutex> lock(mu_);
  slow_list_chunk_ = chunk_bytes;
  slow_list_pause_ = pause;
}

void ApiServer::SendBookmarks() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : watches_) {
    w->bookmark_now = true;
    w->stream->Interrupt();
  }
}

bool RecordedRequest::watch() const {
  const std::string v = param("watch");
  return v == "true" || v == "1";
}

std::string RecordedRequest::param(const std::string& name) const {
  auto it = params.find(name);
  return it == params.end() ? "" : it->second;
}

void ApiServer::Record(const httplib::Request& req) {
  if (options_.request_log_limit == 0) return;
  RecordedRequest r{req.method,
                    req.path,
                    {req.params.begin(), req.params.end()},
                    req.get_header_value("Authorization")};
  std::lock_guard<std::mutex> lock(mu_);
  requests_.push_back(std::move(r));
  while (requests_.size() > options_.request_log_limit) requests_.pop_front();
}

std::vector<RecordedRequest> ApiServer::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {requests_.begin(), requests_.end()};
}

int ApiServer::watch_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(
      std::count_if(requests_.begin(), requests_.end(), [](const auto& r) { return r.watch(); }));
}

bool ApiServer::ClientCertificateAccepted(const httplib::Request& req) const {
  // The handshake already rejected certificates from other CAs; this tells "verified" from "none".
  if (options_.client_ca_pem.empty() || req.ssl == nullptr) return false;
  return SSL_get0_peer_certificate(req.ssl) != nullptr &&
         SSL_get_verify_result(req.ssl) == X509_V_OK;
}

void ApiServer::Stall(absl::Duration duration) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stall_until_ = absl::Now() + duration;
  }
  stall_cv_.notify_all();
}

void ApiServer::Compact() { store_->Compact(); }

void ApiServer::PostGoAway(std::optional<absl::Duration> come_back_after) {
  std::lock_guard<std::mutex> lock(mu_);
  lifecycle_go_away_ = true;
  come_back_at_ =
      come_back_after ? std::optional<absl::Time>(absl::Now() + *come_back_after) : std::nullopt;
  lifecycle_cv_.notify_all();
}

void ApiServer::GoAway(std::optional<absl::Duration> come_back_after) {
  PostGoAway(come_back_after);
  std::unique_lock<std::mutex> lock(mu_);
  down_cv_.wait(lock, [this] { return down_ || stopping_; });
}

absl::Status ApiServer::ComeBack() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (server_ != nullptr) return absl::OkStatus();
    come_back_at_.reset();
    lifecycle_go_away_ = false;
  }
  return Listen();
}

void ApiServer::LifecycleLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (lifecycle_go_away_) {
      lifecycle_go_away_ = false;
      lock.unlock();
      Shutdown(true);
      spdlog::info("lab fault: apiserver went away");
      lock.lock();
      continue;
    }
    if (come_back_at_ && absl::Now() >= *come_back_at_ && server_ == nullptr) {
      come_back_at_.reset();
      lock.unlock();
      absl::Status s = Listen();
      if (!s.ok())
        spdlog::error("lab apiserver: come back: {}", s.ToString());
      else
        spdlog::info("lab fault: apiserver is back on {}", url());
      lock.lock();
      continue;
    }
    if (come_back_at_) {
      lifecycle_cv_.wait_for(lock, absl::ToChronoNanoseconds(std::max(*come_back_at_ - absl::Now(),
                                                                      absl::Milliseconds(1))));
    } else {
      lifecycle_cv_.wait(lock);
    }
  }
}

void ApiServer::InstallHandlers(httplib::Server& server) {
  server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // Compressed watch streams would be buffered by the deflater: never compress.
    const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
    Record(req);
    static const std::set<std::string> kAnonymous = {"/healthz", "/livez", "/readyz", "/version"};
    if (!kAnonymous.contains(req.path) && !ClientCertificateAccepted(req)) {
      std::string auth = req.get_header_value("Authorization");
      if (auth != "Bearer " + token()) {
        ReplyStatus(res, 401, "Unauthorized", "Unauthorized");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (!absl::StartsWith(req.path, "/lab/")) {
      std::unique_lock<std::mutex> lock(mu_);
      while (!stopping_ && !down_ && absl::Now() < stall_until_) {
        stall_cv_.wait_for(lock, absl::ToChronoNanoseconds(stall_until_ - absl::Now()));
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  server.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    spdlog::debug("lab apiserver: {} {} -> {}", req.method, req.target, res.status);
  });
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res); };
  server.Get(".*", handler);
  server.Post(".*", handler);
  server.Put(".*", handler);
  server.Patch(".*", handler);
  server.Delete(".*", handler);
}

void ApiServer::HandleFaults(const httplib::Request& req, httplib::Response& res) {
  if (req.method == "GET") {
    std::lock_guard<std::mutex> lock(mu_);
    return Reply(res, 200,
                 {{"openWatches", watches_.size()},
                  {"failNextWatches", fail_watches_},
                  {"resourceVersion", store_->CurrentResourceVersion()},
                  {"oldestWatchableResourceVersion", store_->OldestWatchableResourceVersion()}});
  }
  if (req.method != "POST") return ReplyStatus(res, 405, "MethodNotAllowed", "use POST");
  json body = json::parse(req.body, nullptr, false);
  if (!body.is_object() || !body.contains("action") || !body["action"].is_string()) {
    return ReplyStatus(res, 400, "BadRequest", "expected {\"action\": ...}");
  }
  std::string action = body["action"];
  double seconds = body.value("seconds", 0.0);
  if (action == "cut-watches") {
    CutWatches({body.value("midEvent", false), body.value("atNextEvent", false)});
  } else if (action == "expire-watches") {
    FailNextWatches(body.value("count", 1));
  } else if (action == "stall") {
    Stall(absl::Seconds(seconds));
  } else if (action == "go-away") {
    if (seconds <= 0) {
      return ReplyStatus(res, 400, "BadRequest", "go-away needs seconds > 0 to come back");
    }
    // Answer first: the listener closes once this request has been written.
    PostGoAway(absl::Seconds(seconds));
  } else if (action == "compact") {
    Compact();
  } else if (action == "freeze-watches") {
    FreezeWatches();
  } else if (action == "cut-next-watch") {
    CutNextWatchAfter(body.value("count", 0));
  } else if (action == "expire-continues") {
    ExpireNextContinues(body.value("count", 1));
  } else if (action == "bookmark") {
    SendBookmarks();
  } else {
    return ReplyStatus(res, 400, "BadRequest", absl::StrCat("unknown fault action ", action));
  }
  Reply(res, 200,
        {{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}, {"message", action}});
}

}  // namespace sluice::lab
