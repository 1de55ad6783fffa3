#include "agent/k8s/http_client.h"

#include <curl/curl.h>

#include <cstring>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sluice::k8s {
namespace {

constexpr size_t kMaxErrorBody = 1 << 20;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Transfer {
  CURL* easy = nullptr;
  const HttpClient::BodyFn* on_body = nullptr;
  HttpResult* result = nullptr;
  bool status_known = false;
};

size_t OnWrite(char* ptr, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t n = size * nmemb;
  if (!t->status_known) {
    long code = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code);
    t->result->status = code;
    t->status_known = true;
  }
  HttpResult& r = *t->result;
  if (r.status >= 200 && r.status < 300) {
    r.body_bytes += n;
    if (*t->on_body && !(*t->on_body)(std::string_view(ptr, n))) {
      r.aborted_by_callback = true;
      return 0;  // CURLE_WRITE_ERROR
    }
    return n;
  }
  if (r.error_body.size() < kMaxErrorBody) {
    r.error_body.append(ptr, std::min(n, kMaxErrorBody - r.error_body.size()));
  }
  return n;
}

size_t OnHeader(char* buffer, size_t size, size_t nitems, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t n = size * nitems;
  absl::string_view line(buffer, n);
  if (absl::StartsWith(line, "HTTP/")) {
    t->result->retry_after.reset();  // a new response (after 100-continue, proxies)
    t->status_known = false;
  } else if (line.size() > 12 && absl::EqualsIgnoreCase(line.substr(0, 12), "retry-after:")) {
    std::string value(absl::StripAsciiWhitespace(line.substr(12)));
    int64_t secs = 0;
    if (absl::SimpleAtoi(value, &secs) && secs >= 0) t->result->retry_after = absl::Seconds(secs);
  }
  return n;
}

void SetBlob(CURL* easy, CURLoption opt, const std::string& pem) {
  curl_blob blob{const_cast<char*>(pem.data()), pem.size(), CURL_BLOB_COPY};
  curl_easy_setopt(easy, opt, &blob);
}

}  // namespace

void Canceller::Cancel() {
  cancelled_.store(true, std::memory_order_release);
  absl::MutexLock lock(&mu_);
  for (void* multi : active_) curl_multi_wakeup(static_cast<CURLM*>(multi));
}

bool Canceller::Register(void* multi) {
  absl::MutexLock lock(&mu_);
  if (cancelled()) return false;
  active_.insert(multi);
  return true;
}

void Canceller::Unregister(void* multi) {
  absl::MutexLock lock(&mu_);
  active_.erase(multi);
}

std::string HttpResult::Describe() const {
  if (cancelled) return "cancelled";
  if (aborted_by_callback) return "aborted while processing the body";
  if (curl_code != 0) {
    return absl::StrCat("curl error ", curl_code, " (", error.empty() ? curl_easy_strerror(
                                                                            CURLcode(curl_code))
                                                                      : error,
                        ")", status ? absl::StrCat(" after HTTP ", status) : "");
  }
  return absl::StrCat("HTTP ", status);
}

HttpClient::HttpClient(ClientConfig config, Options options, std::unique_ptr<TokenSource> tokens)
    : config_(std::move(config)), options_(std::move(options)), tokens_(std::move(tokens)) {
  GlobalInit();
  if (!tokens_) tokens_ = TokenSource::FromConfig(config_);
}

HttpClient::HttpClient(ClientConfig config) : HttpClient(std::move(config), Options{}, nullptr) {}

HttpClient::~HttpClient() = default;

HttpResult HttpClient::Get(const HttpRequest& req, const BodyFn& on_body, Canceller* cancel) {
  HttpResult r = GetOnce(req, on_body, cancel);
  if (r.status == 401 && r.curl_code == 0 && tokens_->Invalidate()) {
    spdlog::info("k8s: 401 on {}: re-reading the token and retrying once", req.path);
    r = GetOnce(req, on_body, cancel);
    r.retried_unauthorized = true;
  }
  return r;
}

HttpResult HttpClient::GetOnce(const HttpRequest& req, const BodyFn& on_body, Canceller* cancel) {
  HttpResult result;
  CURL* easy = curl_easy_init();
  CURLM* multi = curl_multi_init();
  if (easy == nullptr || multi == nullptr) {
    if (easy) curl_easy_cleanup(easy);
    if (multi) curl_multi_cleanup(multi);
    result.curl_code = CURLE_OUT_OF_MEMORY;
    result.error = "curl handle allocation failed";
    return result;
  }
  char errbuf[CURL_ERROR_SIZE] = {0};
  Transfer t{easy, &on_body, &result, false};
  const std::string url = config_.server + req.path;

  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, long(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "https");
  curl_easy_setopt(easy, CURLOPT_USERAGENT, options_.user_agent.c_str());
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &OnWrite);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                   long(absl::ToInt64Milliseconds(options_.connect_timeout)));
  if (req.timeout > absl::ZeroDuration()) {
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, long(absl::ToInt64Milliseconds(req.timeout)));
  }
  if (req.idle_timeout > absl::ZeroDuration()) {
    curl_easy_setopt(easy, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(easy, CURLOPT_LOW_SPEED_TIME,
                     std::max(1L, long(absl::ToInt64Seconds(req.idle_timeout))));
  }
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPIDLE, 30L);
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPINTVL, 10L);
  if (req.accept_gzip) curl_easy_setopt(easy, CURLOPT_ACCEPT_ENCODING, "gzip");
  if (req.method != "GET") {
    curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
  if (!req.body.empty()) {
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(req.body.size()));
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, req.body.data());
  }

  // TLS: always verified; only the configured CA is trusted when one is given.
  curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!config_.ca_pem.empty()) {
    SetBlob(easy, CURLOPT_CAINFO_BLOB, config_.ca_pem);
    curl_easy_setopt(easy, CURLOPT_CAPATH, nullptr);
  } else if (!config_.ca_file.empty()) {
    curl_easy_setopt(easy, CURLOPT_CAINFO, config_.ca_file.c_str());
    curl_easy_setopt(easy, CURLOPT_CAPATH, nullptr);
  }
  if (!config_.client_cert_pem.empty()) {
    SetBlob(easy, CURLOPT_SSLCERT_BLOB, config_.client_cert_pem);
  } else if (!config_.client_cert_file.empty()) {
    curl_easy_setopt(easy, CURLOPT_SSLCERT, config_.client_cert_file.c_str());
  }
  curl_easy_setopt(easy, CURLOPT_SSLCERTTYPE, "PEM");
  if (!config_.client_key_pem.empty()) {
    SetBlob(easy, CURLOPT_SSLKEY_BLOB, config_.client_key_pem);
  } else if (!config_.client_key_file.empty()) {
    curl_easy_setopt(easy, CURLOPT_SSLKEY, config_.client_key_file.c_str());
  }
  curl_easy_setopt(easy, CURLOPT_SSLKEYTYPE, "PEM");

  curl_slist* headers = curl_slist_append(nullptr, "Accept: application/json");
  const std::string token = tokens_->Token();
  std::string auth;
  if (!token.empty()) {
    auth = absl::StrCat("Authorization: Bearer ", token);
    headers = curl_slist_append(headers, auth.c_str());
  }
  std::string content_type;
  if (!req.body.empty()) {
    content_type = absl::StrCat("Content-Type: ", req.content_type);
    headers = curl_slist_append(headers, content_type.c_str());
    headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  }
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);

  curl_multi_add_handle(multi, easy);
  bool registered = false;
  if (cancel != nullptr) {
    registered = cancel->Register(multi);
    if (!registered) result.cancelled = true;
  }
  int running = 1;
  while (!result.cancelled) {
    CURLMcode mc = curl_multi_perform(multi, &running);
    if (mc != CURLM_OK) {
      result.curl_code = CURLE_FAILED_INIT;
      result.error = curl_multi_strerror(mc);
      break;
    }
    if (running == 0) break;
    if (cancel != nullptr && cancel->cancelled()) {
      result.cancelled = true;
      break;
    }
    curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
  }
  if (result.cancelled) {
    result.curl_code = CURLE_ABORTED_BY_CALLBACK;
    result.error = "cancelled";
  } else if (result.curl_code == 0) {
    int queued = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi, &queued)) {
      if (msg->msg == CURLMSG_DONE && msg->easy_handle == easy) {
        result.curl_code = msg->data.result;
      }
    }
    if (result.curl_code != 0) result.error = errbuf[0] ? errbuf : curl_easy_strerror(
                                                                    CURLcode(result.curl_code));
  }
  if (!t.status_known || result.status == 0) {
    long code = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code);
    result.status = code;
  }
  if (registered) cancel->Unregister(multi);
  curl_multi_remove_handle(multi, easy);
  curl_slist_free_all(headers);
  curl_easy_cleanup(easy);
  curl_multi_cleanup(multi);
  return result;
}

}  // namespace sluice::k8s
