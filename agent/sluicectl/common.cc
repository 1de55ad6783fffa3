#include "agent/sluicectl/common.h"

#include <arpa/inet.h>
#include <time.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "agent/base/cli.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/metrics/http_server.h"
#include "agent/monitor/observe_server.h"
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

std::string ExplainPermission(const absl::Status& status) {
  return cli::ExplainPermission(
      status, absl::StrCat("sluicectl reads the agent's pinned maps (under --bpffs_root=",
                           absl::GetFlag(FLAGS_bpffs_root),
                           ") and its state directory: run it as root (or with CAP_BPF and "
                           "access to those files), as the agent runs"));
}

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

namespace {

struct LearntNode {
  std::string not_reached;
  bool state_dir_known = true;
  std::string observe_socket = monitor::kDefaultObserveSocket;
};

LearntNode& Learnt() {
  static LearntNode* learnt = new LearntNode();
  return *learnt;
}

}  // namespace

void LearnNodeFromAgent(const std::vector<std::string>& explicit_flags) {
  auto given = [&](const char* name) {
    return std::find(explicit_flags.begin(), explicit_flags.end(), name) != explicit_flags.end();
  };
  LearntNode& learnt = Learnt();
  auto body = AgentGet("/config");
  nlohmann::json config;
  if (body.ok()) config = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("flags") || !config["flags"].is_object()) {
    learnt.state_dir_known = given("state_dir");
    if (given("bpffs_root") && given("state_dir")) return;  // nothing guessed
    std::string guessed;
    for (const char* name : {"bpffs_root", "state_dir"}) {
      if (given(name)) continue;
      absl::StrAppend(&guessed, guessed.empty() ? "" : " and ", "--", name, "=",
                      name == std::string("bpffs_root") ? absl::GetFlag(FLAGS_bpffs_root)
                                                        : absl::GetFlag(FLAGS_state_dir));
    }
    learnt.not_reached = absl::StrCat(
        body.ok()
            ? absl::StrCat("the agent on ", absl::GetFlag(FLAGS_agent), " sent no configuration")
            : std::string(body.status().message()),
        ", so this reads the defaults ", guessed,
        ", which may not be the agent's: pass the agent's --bpffs_root and --state_dir, or "
        "--agent=HOST:PORT (its --health_address); in a sluice-lab, --node NODE; in a cluster, "
        "run sluicectl in the agent's pod (kubectl exec)");
    return;
  }
  const nlohmann::json& flags = config["flags"];
  auto take = [&](const char* name, absl::Flag<std::string>* flag) {
    if (given(name) || !flags.contains(name) || !flags[name].is_string()) return;
    absl::SetFlag(flag, flags[name].get<std::string>());
  };
  take("bpffs_root", &FLAGS_bpffs_root);
  take("state_dir", &FLAGS_state_dir);
  if (flags.contains("observe_socket") && flags["observe_socket"].is_string()) {
    learnt.observe_socket = flags["observe_socket"].get<std::string>();
  }
}

const std::string& AgentNotReached() { return Learnt().not_reached; }
bool StateDirKnown() { return Learnt().state_dir_known; }
std::string ObserveSocket() { return Learnt().observe_socket; }

bool PodSelected(const std::string& pod_name) {
  const std::string want = absl::GetFlag(FLAGS_pod);
  return want.empty() || pod_name == want;
}

bool PodFlagNamesALocalPod() {
  const std::string want = absl::GetFlag(FLAGS_pod);
  if (want.empty()) return true;
  std::error_code ec;
  std::vector<agent::Endpoint> records = EndpointRecords(&ec);
  for (const agent::Endpoint& e : records) {
    if (PodName(e) == want) return true;
  }
  std::fprintf(stderr, "sluicectl: --pod=%s: %s\n", want.c_str(),
               ec ? absl::StrCat("cannot read the endpoint records under ",
                                 absl::GetFlag(FLAGS_state_dir), ": ", ec.message())
                        .c_str()
                  : absl::StrCat("no endpoint of that pod on this node (", records.size(),
                                 " endpoint records under ", absl::GetFlag(FLAGS_state_dir),
                                 "; NAMESPACE/NAME as `sluicectl endpoints` lists them)")
                        .c_str());
  return false;
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
