#include "agent/lab/apiserver.h"

#include <httplib.h>
#include <openssl/pem.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/lab/tls.h"
#include "spdlog/spdlog.h"

namespace sluice::lab {

using nlohmann::json;

nlohmann::json StatusObject(int code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
          {"status", "Failure"}, {"message", message}, {"reason", reason},
          {"code", code}};
}

namespace {

constexpr char kJson[] = "application/json";

void Reply(httplib::Response& res, int code, const json& body) {
  res.status = code;
  res.set_content(body.dump(), kJson);
}

void ReplyStatus(httplib::Response& res, int code, const std::string& reason,
                 const std::string& message) {
  Reply(res, code, StatusObject(code, reason, message));
}

void ReplyError(httplib::Response& res, const absl::Status& s, const ResourceType* type = nullptr,
                const std::string& name = "") {
  std::string message(s.message());
  int code = 500;
  std::string reason = "InternalError";
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      code = 404, reason = "NotFound";
      break;
    case absl::StatusCode::kAlreadyExists:
      code = 409, reason = "AlreadyExists";
      break;
    case absl::StatusCode::kAborted:
      code = 409, reason = "Conflict";
      break;
    case absl::StatusCode::kInvalidArgument:
      code = 422, reason = "Invalid";
      break;
    case absl::StatusCode::kFailedPrecondition:
      code = 400, reason = "BadRequest";
      break;
    case absl::StatusCode::kOutOfRange:
      code = 410, reason = "Expired";
      break;
    case absl::StatusCode::kUnimplemented:
      code = 405, reason = "MethodNotAllowed";
      break;
    default:
      break;
  }
  json body = StatusObject(code, reason, message);
  if (type != nullptr) {
    body["details"] = {{"kind", type->plural}};
    if (!type->group.empty()) body["details"]["group"] = type->group;
    if (!name.empty()) body["details"]["name"] = name;
  }
  Reply(res, code, body);
}

std::string EventLine(const std::string& type, const json& object) {
  json e = {{"type", type}, {"object", object}};
  return e.dump() + "\n";
}

json ApiResourceList(const std::string& group_version) {
  json resources = json::array();
  for (const ResourceType& r : BuiltinResources()) {
    if (r.ApiVersion() != group_version) continue;
    json entry = {{"name", r.plural},
                  {"singularName", r.singular},
                  {"namespaced", r.namespaced},
                  {"kind", r.kind},
                  {"verbs", json::array({"create", "delete", "deletecollection", "get", "list",
                                         "patch", "update", "watch"})}};
    if (!r.short_names.empty()) entry["shortNames"] = r.short_names;
    if (r.plural == "pods" || r.plural == "services") entry["categories"] = {"all"};
    resources.push_back(entry);
    if (r.has_status) {
      resources.push_back({{"name", r.plural + "/status"},
                           {"singularName", ""},
                           {"namespaced", r.namespaced},
                           {"kind", r.kind},
                           {"verbs", json::array({"get", "patch", "update"})}});
    }
  }
  return {{"kind", "APIResourceList"},
          {"apiVersion", "v1"},
          {"groupVersion", group_version},
          {"resources", resources}};
}

json ApiGroup(const std::string& name) {
  json gv = {{"groupVersion", name + "/v1"}, {"version", "v1"}};
  return {{"kind", "APIGroup"},
          {"apiVersion", "v1"},
          {"name", name},
          {"versions", json::array({gv})},
          {"preferredVersion", gv}};
}

const std::vector<std::string>& Groups() {
  static const std::vector<std::string> kGroups = {"discovery.k8s.io", "networking.k8s.io"};
  return kGroups;
}

// ---- strategic merge patch -----------------------------------------------------------------

std::string MergeKeyFor(const std::string& path) {
  auto ends = [&](const char* suffix) {
    return path == suffix || absl::EndsWith(path, absl::StrCat(".", suffix));
  };
  if (ends("containers") || ends("initContainers") || ends("ephemeralContainers") ||
      ends("volumes") || ends("env") || ends("imagePullSecrets")) {
    return "name";
  }
  if (ends("containers.ports") || ends("initContainers.ports") ||
      ends("ephemeralContainers.ports")) {
    return "containerPort";
  }
  if (path == "spec.ports") return "port";  // Service ports
  if (ends("volumeMounts")) return "mountPath";
  if (ends("volumeDevices")) return "devicePath";
  if (ends("hostAliases")) return "ip";
  if (path == "status.conditions") return "type";
  if (path == "status.addresses") return "type";
  if (path == "status.podIPs" || path == "status.hostIPs") return "ip";
  if (path == "metadata.ownerReferences") return "uid";
  if (path == "spec.taints") return "key";
  return "";
}

json StripDirectives(const json& j) {
  if (j.is_object()) {
    json out = json::object();
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (absl::StartsWith(it.key(), "$")) continue;
      out[it.key()] = StripDirectives(it.value());
    }
    return out;
  }
  if (j.is_array()) {
    json out = json::array();
    for (const json& e : j) out.push_back(StripDirectives(e));
    return out;
  }
  return j;
}

json MergeObject(const json& original, const json& patch, const std::string& path);

json MergeList(const json& original, const json& patch, const std::string& key) {
  json result = original.is_array() ? original : json::array();
  for (const json& p : patch) {
    if (!p.is_object() || !p.contains(key)) {
      result.push_back(StripDirectives(p));
      continue;
    }
    auto match = std::find_if(result.begin(), result.end(), [&](const json& e) {
      return e.is_object() && e.contains(key) && e[key] == p[key];
    });
    if (p.value("$patch", "") == "delete") {
      if (match != result.end()) result.erase(match);
      continue;
    }
    if (match != result.end()) {
      *match = MergeObject(*match, p, "");
    } else {
      result.push_back(StripDirectives(p));
    }
  }
  return result;
}

json MergeObject(const json& original, const json& patch, const std::string& path) {
  if (!patch.is_object()) return patch;
  if (patch.value("$patch", "") == "replace") return StripDirectives(patch);
  json result = original.is_object() ? original : json::object();
  std::map<std::string, json> orders;
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    std::string child = path.empty() ? k : path + "." + k;
    if (absl::StartsWith(k, "$setElementOrder/")) {
      orders[k.substr(strlen("$setElementOrder/"))] = v;
    } else if (absl::StartsWith(k, "$deleteFromPrimitiveList/")) {
      std::string field = k.substr(strlen("$deleteFromPrimitiveList/"));
      if (result[field].is_array() && v.is_array()) {
        json kept = json::array();
        for (const json& e : result[field]) {
          if (std::find(v.begin(), v.end(), e) == v.end()) kept.push_back(e);
        }
        result[field] = kept;
      }
    } else if (k == "$retainKeys" || k == "$patch") {
      continue;
    } else if (v.is_null()) {
      result.erase(k);
    } else if (v.is_object()) {
      if (v.value("$patch", "") == "delete") {
        result.erase(k);
      } else {
        result[k] = MergeObject(result.contains(k) ? result[k] : json(), v, child);
      }
    } else if (v.is_array()) {
      std::string key = MergeKeyFor(child);
      result[k] = key.empty() ? StripDirectives(v) : MergeList(result[k], v, key);
    } else {
      result[k] = v;
    }
  }
  if (patch.contains("$retainKeys") && patch["$retainKeys"].is_array()) {
    const json& keep = patch["$retainKeys"];
    for (auto it = result.begin(); it != result.end();) {
      if (std::find(keep.begin(), keep.end(), it.key()) == keep.end()) {
        it = result.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [field, order] : orders) {
    std::string key = MergeKeyFor(path.empty() ? field : path + "." + field);
    if (key.empty() || !result[field].is_array() || !order.is_array()) continue;
    json sorted = json::array();
    json rest = result[field];
    for (const json& o : order) {
      if (!o.is_object() || !o.contains(key)) continue;
      for (auto e = rest.begin(); e != rest.end(); ++e) {
        if (e->is_object() && e->contains(key) && (*e)[key] == o[key]) {
          sorted.push_back(*e);
          rest.erase(e);
          break;
        }
      }
    }
    for (const json& e : rest) sorted.push_back(e);
    result[field] = sorted;
  }
  return result;
}

struct Route {
  const ResourceType* type = nullptr;
  std::string ns;
  std::string name;
  std::string subresource;
};

// /api/v1/... or /apis/G/V/... -> resource, namespace, name, subresource.
std::optional<Route> ParseRoute(const std::string& path) {
  std::vector<std::string> seg = absl::StrSplit(path, '/', absl::SkipEmpty());
  std::string group, version;
  size_t i = 0;
  if (seg.size() >= 3 && seg[0] == "api") {
    version = seg[1];
    i = 2;
  } else if (seg.size() >= 4 && seg[0] == "apis") {
    group = seg[1];
    version = seg[2];
    i = 3;
  } else {
    return std::nullopt;
  }
  Route r;
  if (seg.size() - i >= 3 && seg[i] == "namespaces") {
    const ResourceType* t = FindResource(group, version, seg[i + 2]);
    if (t != nullptr && t->namespaced) {
      r.type = t;
      r.ns = seg[i + 1];
      i += 3;
      if (i < seg.size()) r.name = seg[i++];
      if (i < seg.size()) r.subresource = seg[i++];
      if (i != seg.size()) return std::nullopt;
      return r;
    }
  }
  r.type = FindResource(group, version, seg[i++]);
  if (r.type == nullptr) return std::nullopt;
  if (i < seg.size()) r.name = seg[i++];
  if (i < seg.size()) r.subresource = seg[i++];
  if (i != seg.size()) return std::nullopt;
  if (!r.name.empty() && r.type->namespaced) return std::nullopt;  // needs /namespaces/NS/
  return r;
}

bool ParamTrue(const httplib::Request& req, const char* name) {
  std::string v = req.get_param_value(name);
  return v == "true" || v == "1";
}

std::string RandomToken() {
  absl::BitGen gen;
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string t;
  for (int i = 0; i < 32; ++i) t.push_back(kChars[absl::Uniform(gen, 0u, 36u)]);
  return t;
}

}  // namespace

json StrategicMergePatch(const json& original, const json& patch) {
  return MergeObject(original, patch, "");
}

// ---- ApiServer -----------------------------------------------------------------------------

struct ApiServer::ActiveWatch {
  std::unique_ptr<WatchStream> stream;
  uint64_t cut_generation;
  std::atomic<bool> shutdown{false};
};

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
  spdlog::info("lab fault: cut {} watch streams (mid_event={}, at_next_event={})", watches_.size(),
               cut.mid_event, cut.at_next_event);
}

void ApiServer::FailNextWatches(int count) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_watches_ = count;
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
    static const std::set<std::string> kAnonymous = {"/healthz", "/livez", "/readyz", "/version"};
    if (!kAnonymous.contains(req.path)) {
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

void ApiServer::Handle(const httplib::Request& req, httplib::Response& res) {
  const std::string& path = req.path;
  if (path == "/lab/faults") return HandleFaults(req, res);
  if (req.method == "GET") {
    if (path == "/healthz" || path == "/livez" || path == "/readyz") {
      res.set_content("ok", "text/plain");
      return;
    }
    if (path == "/version") {
      return Reply(res, 200,
                   {{"major", "1"},
                    {"minor", "32"},
                    {"gitVersion", "v1.32.0-sluice-lab"},
                    {"gitCommit", "0000000000000000000000000000000000000000"},
                    {"gitTreeState", "clean"},
                    {"buildDate", "2025-01-01T00:00:00Z"},
                    {"goVersion", "go1.23"},
                    {"compiler", "gc"},
                    {"platform", "linux/amd64"}});
    }
    if (path == "/api") {
      return Reply(
          res, 200,
          {{"kind", "APIVersions"},
           {"versions", {"v1"}},
           {"serverAddressByClientCIDRs",
            json::array({{{"clientCIDR", "0.0.0.0/0"},
                          {"serverAddress", absl::StrCat(options_.address, ":", port_)}}})}});
    }
    if (path == "/apis") {
      json groups = json::array();
      for (const std::string& g : Groups()) {
        json group = ApiGroup(g);
        group.erase("kind");
        group.erase("apiVersion");
        groups.push_back(group);
      }
      return Reply(res, 200, {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}});
    }
    if (path == "/api/v1") return Reply(res, 200, ApiResourceList("v1"));
    for (const std::string& g : Groups()) {
      if (path == "/apis/" + g) return Reply(res, 200, ApiGroup(g));
      if (path == "/apis/" + g + "/v1") return Reply(res, 200, ApiResourceList(g + "/v1"));
    }
  }
  std::optional<Route> route = ParseRoute(path);
  if (!route || (!route->subresource.empty() && route->subresource != "status") ||
      (route->subresource == "status" && !route->type->has_status)) {
    return ReplyStatus(res, 404, "NotFound", "the server could not find the requested resource");
  }
  const ResourceType& type = *route->type;
  const std::string& ns = route->ns;
  const std::string& name = route->name;
  auto sub = route->subresource == "status" ? ObjectStore::Subresource::kStatus
                                            : ObjectStore::Subresource::kMain;

  auto parse_body = [&](json* out) -> bool {
    *out = json::parse(req.body, nullptr, false);
    if (out->is_discarded() || !out->is_object()) {
      ReplyStatus(res, 400, "BadRequest", "the request body is not a JSON object");
      return false;
    }
    return true;
  };
  auto fix_namespace = [&](json& obj) -> bool {
    if (!type.namespaced) return true;
    std::string body_ns = obj["metadata"].value("namespace", "");
    if (!body_ns.empty() && body_ns != ns) {
      ReplyStatus(res, 400, "BadRequest",
                  "the namespace of the provided object does not match the namespace sent on "
                  "the request");
      return false;
    }
    obj["metadata"]["namespace"] = ns;
    return true;
  };

  if (req.method == "GET" && name.empty()) {
    if (ParamTrue(req, "watch")) return HandleWatch(req, res, type, ns);
    ListOptions opts;
    opts.namespace_name = ns;
    auto labels = LabelSelector::Parse(req.get_param_value("labelSelector"));
    if (!labels.ok())
      return ReplyStatus(res, 400, "BadRequest", std::string(labels.status().message()));
    auto fields = FieldSelector::Parse(req.get_param_value("fieldSelector"), type.plural);
    if (!fields.ok())
      return ReplyStatus(res, 400, "BadRequest", std::string(fields.status().message()));
    opts.labels = *labels;
    opts.fields = *fields;
    if (req.has_param("limit") && !absl::SimpleAtoi(req.get_param_value("limit"), &opts.limit)) {
      return ReplyStatus(res, 400, "BadRequest", "limit must be an integer");
    }
    opts.continue_token = req.get_param_value("continue");
    auto list = store_->List(type, opts);
    if (!list.ok()) return ReplyError(res, list.status(), &type);
    std::string out =
        absl::StrCat("{\"kind\":\"", type.kind, "List\",\"apiVersion\":\"", type.ApiVersion(),
                     "\",\"metadata\":{\"resourceVersion\":\"", list->resource_version, "\"");
    if (!list->continue_token.empty()) {
      absl::StrAppend(&out, ",\"continue\":\"", list->continue_token, "\"");
    }
    absl::StrAppend(&out, "},\"items\":[");
    for (size_t i = 0; i < list->items.size(); ++i) {
      if (i > 0) out.push_back(',');
      out += list->items[i]->dump();
    }
    out += "]}";
    res.status = 200;
    res.set_content(out, kJson);
    return;
  }
  if (req.method == "GET") {
    auto obj = store_->Get(type, ns, name);
    if (!obj.ok()) return ReplyError(res, obj.status(), &type, name);
    return Reply(res, 200, *obj);
  }
  if (req.method == "POST" && name.empty()) {
    json obj;
    if (!parse_body(&obj) || !fix_namespace(obj)) return;
    auto created = store_->Create(type, std::move(obj));
    if (!created.ok()) return ReplyError(res, created.status(), &type);
    return Reply(res, 201, *created);
  }
  if (req.method == "PUT" && !name.empty()) {
    json obj;
    if (!parse_body(&obj) || !fix_namespace(obj)) return;
    std::string body_name = obj["metadata"].value("name", "");
    if (body_name.empty()) obj["metadata"]["name"] = name;
    if (!body_name.empty() && body_name != name) {
      return ReplyStatus(res, 400, "BadRequest",
                         "the name of the object does not match the name on the URL");
    }
    auto updated = store_->Replace(type, std::move(obj), sub);
    if (!updated.ok()) return ReplyError(res, updated.status(), &type, name);
    return Reply(res, 200, *updated);
  }
  if (req.method == "PATCH" && !name.empty()) {
    std::string content_type = req.get_header_value("Content-Type");
    std::string kind = content_type.substr(0, content_type.find(';'));
    if (kind != "application/merge-patch+json" &&
        kind != "application/strategic-merge-patch+json" && kind != "application/json-patch+json") {
      return ReplyStatus(res, 415, "UnsupportedMediaType",
                         absl::StrCat("the body of the request was in an unknown format - "
                                      "accepted media types include: application/json-patch+json, "
                                      "application/merge-patch+json, "
                                      "application/strategic-merge-patch+json (got ",
                                      content_type, ")"));
    }
    json patch = json::parse(req.body, nullptr, false);
    if (patch.is_discarded()) return ReplyStatus(res, 400, "BadRequest", "invalid patch body");
    auto updated = store_->Update(
        type, ns, name,
        [&](json& current) -> absl::Status {
          std::string rv = current["metadata"].value("resourceVersion", "");
          json patched;
          if (kind == "application/json-patch+json") {
            if (!patch.is_array()) return absl::FailedPreconditionError("a JSON patch is a list");
            try {
              patched = current.patch(patch);
            } catch (const json::exception& e) {
              return absl::InvalidArgumentError(absl::StrCat("json patch: ", e.what()));
            }
          } else if (!patch.is_object()) {
            return absl::FailedPreconditionError("a merge patch must be a JSON object");
          } else if (kind == "application/merge-patch+json") {
            patched = current;
            patched.merge_patch(patch);
          } else {
            patched = StrategicMergePatch(current, patch);
          }
          if (!patched.is_object() || !patched["metadata"].is_object()) {
            return absl::FailedPreconditionError("the patch removed the object's metadata");
          }
          std::string want = patched["metadata"].value("resourceVersion", "");
          if (!want.empty() && want != rv) {
            return absl::AbortedError(absl::StrCat(
                "Operation cannot be fulfilled on ", QualifiedResource(type), " \"", name,
                "\": the object has been modified; please apply your changes to the latest "
                "version and try again"));
          }
          current = std::move(patched);
          return absl::OkStatus();
        },
        sub);
    if (!updated.ok()) return ReplyError(res, updated.status(), &type, name);
    return Reply(res, 200, *updated);
  }
  if (req.method == "DELETE") {
    ObjectStore::DeleteOptions opts;
    json body = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
    if (body.is_discarded()) return ReplyStatus(res, 400, "BadRequest", "invalid DeleteOptions");
    if (body.is_object()) {
      if (body.contains("gracePeriodSeconds") && body["gracePeriodSeconds"].is_number_integer()) {
        opts.grace_period_seconds = body["gracePeriodSeconds"].get<int64_t>();
      }
      if (body.contains("preconditions") && body["preconditions"].is_object()) {
        opts.precondition_uid = body["preconditions"].value("uid", "");
        opts.precondition_resource_version = body["preconditions"].value("resourceVersion", "");
      }
    }
    int64_t grace = 0;
    if (req.has_param("gracePeriodSeconds") &&
        absl::SimpleAtoi(req.get_param_value("gracePeriodSeconds"), &grace)) {
      opts.grace_period_seconds = grace;
    }
    std::vector<std::string> names;
    if (!name.empty()) {
      names.push_back(name);
    } else {
      ListOptions lo;
      lo.namespace_name = ns;
      auto labels = LabelSelector::Parse(req.get_param_value("labelSelector"));
      auto fields = FieldSelector::Parse(req.get_param_value("fieldSelector"), type.plural);
      if (!labels.ok() || !fields.ok()) return ReplyStatus(res, 400, "BadRequest", "bad selector");
      lo.labels = *labels;
      lo.fields = *fields;
      auto list = store_->List(type, lo);
      if (!list.ok()) return ReplyError(res, list.status(), &type);
      for (const ObjectPtr& o : list->items) names.push_back((*o)["metadata"].value("name", ""));
    }
    json last;
    for (const std::string& n : names) {
      std::string obj_ns = ns;
      auto result = store_->Delete(type, obj_ns, n, opts);
      if (!result.ok()) {
        if (!name.empty()) return ReplyError(res, result.status(), &type, n);
        continue;
      }
      if (!name.empty() && !result->deleted) return Reply(res, 200, result->object);
      last = result->object;
    }
    json status = {{"kind", "Status"},
                   {"apiVersion", "v1"},
                   {"metadata", json::object()},
                   {"status", "Success"},
                   {"details", {{"kind", type.plural}}}};
    if (!type.group.empty()) status["details"]["group"] = type.group;
    if (!name.empty()) {
      status["details"]["name"] = name;
      status["details"]["uid"] = last["metadata"].value("uid", "");
    }
    return Reply(res, 200, status);
  }
  ReplyStatus(res, 405, "MethodNotAllowed",
              absl::StrCat(req.method, " is not supported on ", path));
}

void ApiServer::HandleWatch(const httplib::Request& req, httplib::Response& res,
                            const ResourceType& type, const std::string& ns) {
  WatchOptions opts;
  opts.namespace_name = ns;
  auto labels = LabelSelector::Parse(req.get_param_value("labelSelector"));
  if (!labels.ok())
    return ReplyStatus(res, 400, "BadRequest", std::string(labels.status().message()));
  auto fields = FieldSelector::Parse(req.get_param_value("fieldSelector"), type.plural);
  if (!fields.ok())
    return ReplyStatus(res, 400, "BadRequest", std::string(fields.status().message()));
  opts.labels = *labels;
  opts.fields = *fields;
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_watches_ > 0) {
      --fail_watches_;
      return ReplyStatus(res, 410, "Expired",
                         absl::StrCat("too old resource version: ", rv.empty() ? "0" : rv, " (",
                                      store_->CurrentResourceVersion(), ")"));
    }
  }
  uint64_t start_rv = store_->CurrentResourceVersion();
  auto stream = store_->Watch(type, opts);
  if (!stream.ok()) return ReplyError(res, stream.status(), &type);
  auto watch = std::make_shared<ActiveWatch>();
  watch->stream = std::move(*stream);
  size_t initial = send_initial ? watch->stream->queued() : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watch->cut_generation = cut_generation_;
    watches_.insert(watch);
  }

  struct StreamState {
    absl::Time deadline;
    absl::Time next_bookmark;
    size_t initial_left;
    bool initial_bookmark_pending;
    uint64_t start_rv;
    std::optional<WatchCut> pending_cut;
  };
  auto st = std::make_shared<StreamState>();
  st->deadline = absl::Now() + timeout;
  st->next_bookmark = bookmarks ? absl::Now() + options_.bookmark_interval : absl::InfiniteFuture();
  st->initial_left = initial;
  st->initial_bookmark_pending = send_initial && bookmarks;
  st->start_rv = start_rv;
  const ResourceType* t = &type;

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
      [this, watch, st, bookmark](size_t, httplib::DataSink& sink) -> bool {
        std::string batch;
        auto flush = [&]() -> bool {
          if (batch.empty()) return true;
          bool ok = sink.write(batch.data(), batch.size());
          batch.clear();
          return ok;
        };
        while (true) {
          if (watch->shutdown) return false;
          if (st->initial_left == 0 && st->initial_bookmark_pending) {
            st->initial_bookmark_pending = false;
            batch += bookmark(st->start_rv, true);
            return flush();
          }
          absl::Time wake = std::min(st->deadline, st->next_bookmark);
          if (!batch.empty()) wake = absl::InfinitePast();  // only drain what is queued
          Event ev;
          WatchStream::Result r = watch->stream->Next(wake, &ev);
          if (r == WatchStream::Result::kEvent) {
            if (st->initial_left > 0) --st->initial_left;
            std::string line = EventLine(EventTypeName(ev.type), *ev.object);
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
  } else {
    return ReplyStatus(res, 400, "BadRequest", absl::StrCat("unknown fault action ", action));
  }
  Reply(res, 200,
        {{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}, {"message", action}});
}

}  // namespace sluice::lab
