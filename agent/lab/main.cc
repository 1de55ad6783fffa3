// sluice-lab: the lab control plane as a process.
//   sluice-lab serve [--listen=127.0.0.1] [--port=6443] [--kubeconfig=PATH] [--token=T]
//   sluice-lab fault --kubeconfig=PATH cut-watches|expire-watches|stall|go-away|compact
//       [--mid_event] [--at_next_event] [--count=N] [--seconds=D]
#include <httplib.h>
#include <openssl/pem.h>
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "agent/lab/apiserver.h"
#include "spdlog/spdlog.h"
#include "yaml-cpp/yaml.h"

ABSL_FLAG(std::string, listen, "127.0.0.1", "address to serve the API on");
ABSL_FLAG(int, port, 6443, "port (0: ephemeral)");
ABSL_FLAG(std::string, kubeconfig, "", "serve: kubeconfig to write; fault: kubeconfig to use");
ABSL_FLAG(std::string, token, "", "bearer token (serve; default random)");
ABSL_FLAG(bool, mid_event, false, "cut-watches: tear an event in half");
ABSL_FLAG(bool, at_next_event, false, "cut-watches: cut at each stream's next event");
ABSL_FLAG(int, count, 1, "expire-watches: how many watch requests get 410");
ABSL_FLAG(double, seconds, 5, "stall / go-away: for how long");
ABSL_FLAG(bool, verbose, false, "log every request");

namespace {

int Serve() {
  sluice::lab::ApiServerOptions o;
  o.address = absl::GetFlag(FLAGS_listen);
  o.port = absl::GetFlag(FLAGS_port);
  o.token = absl::GetFlag(FLAGS_token);
  sluice::lab::ApiServer server(o);
  if (absl::Status s = server.Start(); !s.ok()) {
    spdlog::error("sluice-lab: {}", s.ToString());
    return 1;
  }
  std::string path = absl::GetFlag(FLAGS_kubeconfig);
  if (!path.empty()) {
    if (absl::Status s = server.WriteKubeconfig(path); !s.ok()) {
      spdlog::error("sluice-lab: {}", s.ToString());
      return 1;
    }
    spdlog::info("sluice-lab: kubeconfig written to {}", path);
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("sluice-lab: signal {}, stopping", sig);
  server.Stop();
  return 0;
}

int Fault(const std::string& action) {
  std::string path = absl::GetFlag(FLAGS_kubeconfig);
  if (path.empty()) {
    std::cerr << "fault needs --kubeconfig\n";
    return 2;
  }
  YAML::Node kc = YAML::LoadFile(path);
  std::string server = kc["clusters"][0]["cluster"]["server"].as<std::string>();
  std::string ca;
  absl::Base64Unescape(kc["clusters"][0]["cluster"]["certificate-authority-data"].as<std::string>(),
                       &ca);
  std::string token = kc["users"][0]["user"]["token"].as<std::string>();
  std::string hostport = server.substr(server.find("://") + 3);
  std::string host = hostport.substr(0, hostport.rfind(':'));
  int port = 443;
  (void)absl::SimpleAtoi(hostport.substr(hostport.rfind(':') + 1), &port);
  httplib::SSLClient cli(host, port);
  X509_STORE* store = X509_STORE_new();
  BIO* bio = BIO_new_mem_buf(ca.data(), static_cast<int>(ca.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  X509_STORE_add_cert(store, cert);
  X509_free(cert);
  BIO_free(bio);
  cli.set_ca_cert_store(store);
  cli.enable_server_certificate_verification(true);
  cli.set_bearer_token_auth(token);
  nlohmann::json body = {{"action", action},
                         {"midEvent", absl::GetFlag(FLAGS_mid_event)},
                         {"atNextEvent", absl::GetFlag(FLAGS_at_next_event)},
                         {"count", absl::GetFlag(FLAGS_count)},
                         {"seconds", absl::GetFlag(FLAGS_seconds)}};
  auto r = cli.Post("/lab/faults", body.dump(), "application/json");
  if (!r) {
    std::cerr << "sluice-lab fault: " << httplib::to_string(r.error()) << "\n";
    return 1;
  }
  std::cout << r->body << "\n";
  return r->status == 200 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "sluice-lab serve [--listen --port --kubeconfig --token] | sluice-lab fault --kubeconfig=K "
      "cut-watches|expire-watches|stall|go-away|compact");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_verbose)) spdlog::set_level(spdlog::level::debug);
  if (args.size() >= 2 && std::string(args[1]) == "serve") {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts
    return Serve();
  }
  if (args.size() >= 3 && std::string(args[1]) == "fault") return Fault(args[2]);
  std::cerr << absl::ProgramUsageMessage() << "\n";
  return 2;
}
