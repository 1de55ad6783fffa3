#include "agent/sluicectl/common.h"

#include <arpa/inet.h>
#include <time.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/metrics/http_server.h"
#include "httplib.h"
#include "loader/datapath.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, bpffs_root, SLUICE_DEFAULT_BPFFS_ROOT, "where the agent pins its maps");
ABSL_FLAG(std::string, state_dir, "/var/lib/sluice",
          "the agent's state directory (identities.json, endpoint records)");
ABSL_FLAG(std::string, agent, "127.0.0.1:9879",
          "the agent's --health_address: status, config and Service names come from there");
ABSL_FLAG(std::string, o, "table", "output format of lists: table or json (-o json)");
ABSL_FLAG(std::string, pod, "",
          "NAMESPACE/NAME: only this pod's entries (endpoints, nat, ct list, policy drops)");
ABSL_FLAG(std::string, service, "", "NAMESPACE/NAME: only this Service's frontends (services)");

namespace sluice::ctl {

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // bpf_ktime_get_ns's clock
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

std::string Ip(uint32_t be) {
  char buf[INET_ADDRSTRLEN];
  in_addr a{be};
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

std::string Mac(const uint8_t* m) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4],
                m[5]);
  return buf;
}

const char* Proto(uint8_t p) { return p == 6 ? "tcp" : p == 17 ? "udp" : p == 1 ? "icmp" : "?"; }

bool JsonOutput() {
  const std::string o = absl::GetFlag(FLAGS_o);
  if (o != "table" && o != "json") {
    std::fprintf(stderr, "sluicectl: -o=%s: want table or json\n", o.c_str());
    std::exit(2);
  }
  return o == "json";
}

void PrintJson(const nlohmann::json& j) { std::printf("%s\n", j.dump(2).c_str()); }

absl::StatusOr<std::string> AgentGet(const std::string& path, int* status) {
  const std::string address = absl::GetFlag(FLAGS_agent);
  auto hp = metrics::ParseHostPort(address, "--agent");
  if (!hp.ok()) return hp.status();
  httplib::Client c(hp->first, hp->second);
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(5, 0);
  auto res = c.Get(path);
  if (!res) {
    return absl::UnavailableError(absl::StrCat("the agent does not answer on ", address, " (",
                                               httplib::to_string(res.error()), ")"));
  }
  if (status != nullptr) *status = res->status;
  if (res->status != 200 && res->status != 503) {
    return absl::UnavailableError(
        absl::StrCat("GET ", path, " on ", address, ": HTTP ", res->status));
  }
  return res->body;
}

bool PodSelected(const std::string& pod_name) {
  const std::string want = absl::GetFlag(FLAGS_pod);
  return want.empty() || pod_name == want;
}

bool ServiceSelected(const std::string& service_port) {
  const std::string want = absl::GetFlag(FLAGS_service);
  if (want.empty()) return true;
  return service_port == want || service_port.rfind(want + ":", 0) == 0;
}

std::vector<agent::Endpoint> EndpointRecords(std::error_code* ec) {
  std::vector<agent::Endpoint> out;
  std::error_code dir_ec;
  for (const auto& f :
       std::filesystem::directory_iterator(absl::GetFlag(FLAGS_state_dir) + "/endpoints", dir_ec)) {
    std::ifstream in(f.path());
    std::stringstream text;
    text << in.rdbuf();
    auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    auto e = agent::EndpointFromJson(j);
    if (e.ok()) out.push_back(std::move(*e));
  }
  if (ec != nullptr) *ec = dir_ec;
  return out;
}

std::string PodName(const agent::Endpoint& ep) {
  return ep.pod_name.empty() ? "(no pod name)" : absl::StrCat(ep.pod_namespace, "/", ep.pod_name);
}

std::map<std::string, std::string> PodNamesByAddress() {
  std::map<std::string, std::string> out;
  for (const agent::Endpoint& e : EndpointRecords()) {
    if (!e.ipv4.empty()) out[e.ipv4] = PodName(e);
  }
  return out;
}

}  // namespace sluice::ctl
