// Test helpers: an HTTPS client for the lab apiserver that verifies its certificate against the
// lab CA, a streaming watch reader, and waiting on conditions with deadlines.
#ifndef SLUICE_TESTS_LAB_LAB_CLIENT_H_
#define SLUICE_TESTS_LAB_LAB_CLIENT_H_

#include <httplib.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/lab/apiserver/apiserver.h"
#include "nlohmann/json.hpp"
#include "support/eventually.h"

namespace sluice::lab::testing {

using nlohmann::json;

inline X509_STORE* CaStore(const std::string& pem) {
  X509_STORE* store = X509_STORE_new();
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  X509_STORE_add_cert(store, cert);
  X509_free(cert);
  BIO_free(bio);
  return store;
}

inline std::unique_ptr<httplib::SSLClient> NewClient(const ApiServer& server,
                                                     bool with_token = true) {
  auto cli = std::make_unique<httplib::SSLClient>("127.0.0.1", server.port());
  cli->set_ca_cert_store(CaStore(server.ca_cert_pem()));  // the client owns the store
  cli->enable_server_certificate_verification(true);
  if (with_token) cli->set_bearer_token_auth(server.token());
  cli->set_read_timeout(30, 0);
  cli->set_connection_timeout(5, 0);
  return cli;
}

struct Reply {
  int status = 0;  // 0: transport error
  httplib::Error error = httplib::Error::Success;
  json body;
  std::string raw;
};

inline Reply ToReply(const httplib::Result& r) {
  Reply out;
  out.error = r.error();
  if (!r) return out;
  out.status = r->status;
  out.raw = r->body;
  out.body = json::parse(r->body, nullptr, false);
  return out;
}

class LabClient {
 public:
  explicit LabClient(const ApiServer& server, bool with_token = true)
      : cli_(NewClient(server, with_token)) {}
  Reply Get(const std::string& path) { return ToReply(cli_->Get(path.c_str())); }
  Reply Post(const std::string& path, const json& body) {
    return ToReply(cli_->Post(path.c_str(), body.dump(), "application/json"));
  }
  Reply Put(const std::string& path, const json& body) {
    return ToReply(cli_->Put(path.c_str(), body.dump(), "application/json"));
  }
  Reply Patch(const std::string& path, const json& body,
              const std::string& type = "application/merge-patch+json") {
    return ToReply(cli_->Patch(path.c_str(), body.dump(), type.c_str()));
  }
  Reply Delete(const std::string& path, const json& body = json::object()) {
    return ToReply(cli_->Delete(path.c_str(), body.dump(), "application/json"));
  }
  httplib::SSLClient& raw() { return *cli_; }

 private:
  std::unique_ptr<httplib::SSLClient> cli_;
};

// Streams one watch request on a thread; complete lines are parsed as events, a torn tail is
// kept in `tail()`.
class WatchReader {
 public:
  WatchReader(const ApiServer& server, std::string path) : cli_(NewClient(server)) {
    thread_ = std::thread([this, path] {
      auto r = cli_->Get(path.c_str(), [this](const char* data, size_t len) {
        std::lock_guard<std::mutex> lock(mu_);
        buffer_.append(data, len);
        size_t nl;
        while ((nl = buffer_.find('\n')) != std::string::npos) {
          events_.push_back(json::parse(buffer_.substr(0, nl), nullptr, false));
          buffer_.erase(0, nl + 1);
        }
        cv_.notify_all();
        return !stop_;
      });
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = r.error();
      status_ = r ? r->status : 0;
      if (r && r->status != 200) body_ = r->body;
      cv_.notify_all();
    });
  }
  ~WatchReader() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cli_->stop();
    thread_.join();
  }
  // Waits until at least `n` events arrived (true) or the deadline.
  bool WaitForEvents(size_t n, absl::Duration timeout = absl::Seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                        [&] { return events_.size() >= n; });
  }
  bool WaitDone(absl::Duration timeout = absl::Seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return done_; });
  }
  std::vector<json> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  std::string tail() {
    std::lock_guard<std::mutex> lock(mu_);
    return buffer_;
  }
  httplib::Error error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  int status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  std::string body() {
    std::lock_guard<std::mutex> lock(mu_);
    return body_;
  }

 private:
  std::unique_ptr<httplib::SSLClient> cli_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string buffer_;
  std::vector<json> events_;
  bool stop_ = false;
  bool done_ = false;
  httplib::Error error_ = httplib::Error::Success;
  int status_ = 0;
  std::string body_;
};

using ::sluice::testing::Eventually;

}  // namespace sluice::lab::testing

#endif  // SLUICE_TESTS_LAB_LAB_CLIENT_H_
