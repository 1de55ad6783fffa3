// sluice-operator: cluster-pool IPAM (see operator.h). One replica leads through the Lease
// --leader_election_namespace/--lease_name; it exits 1 when it loses the Lease (as client-go's
// OnStoppedLeading does), so the Deployment restarts it as a follower.
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "agent/base/version.h"
#include "agent/k8s/config.h"
#include "agent/k8s/http_client.h"
#include "agent/metrics/http_server.h"
#include "agent/metrics/registry.h"
#include "agent/operator/cluster_pool.h"
#include "agent/operator/endpoints.h"
#include "agent/operator/operator.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, kubeconfig, "", "kubeconfig to reach the apiserver (default: in-cluster)");
ABSL_FLAG(
    std::string, k8s_service_host, "",
    "apiserver address, overriding the kubeconfig / in-cluster one (with --k8s_service_port)");
ABSL_FLAG(std::string, k8s_service_port, "", "apiserver port, with --k8s_service_host");
ABSL_FLAG(std::string, cluster_pool_ipv4_pod_cidr_list, "10.0.0.0/8",
          "comma-separated IPv4 CIDRs the per-node pod CIDRs are carved out of");
ABSL_FLAG(int, cluster_pool_ipv4_mask_size, 24, "prefix length of each node's pod CIDR");
ABSL_FLAG(std::string, leader_election_namespace, "kube-system", "namespace of the Lease");
ABSL_FLAG(std::string, lease_name, "sluice-operator", "name of the Lease");
ABSL_FLAG(std::string, identity, "",
          "this replica's holderIdentity (default: $POD_NAME, else the hostname)");
ABSL_FLAG(absl::Duration, lease_duration, absl::Seconds(15),
          "how long followers wait after the last renewal they saw before taking the Lease");
ABSL_FLAG(absl::Duration, renew_deadline, absl::Seconds(10),
          "the leader steps down (exits 1) after failing to renew for this long");
ABSL_FLAG(absl::Duration, retry_period, absl::Seconds(2), "between acquire/renew attempts");
ABSL_FLAG(std::string, health_address, "127.0.0.1:9234",
          "HOST:PORT serving GET /healthz (liveness) and /readyz (readiness); empty: none");
ABSL_FLAG(std::string, metrics_address, "",
          "HOST:PORT serving GET /metrics (Prometheus); may equal --health_address; empty: none");

namespace {

int Fail(const absl::Status& s, const char* what) {
  spdlog::critical("sluice-operator: {}: {}", what, s.ToString());
  return 2;
}

std::string DefaultIdentity() {
  if (const char* pod = std::getenv("POD_NAME"); pod != nullptr && *pod != '\0') return pod;
  char host[HOST_NAME_MAX + 1] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') return host;
  return "sluice-operator";
}

// --help: this binary's own flags, exit 0 (abseil's --help lists only flags of a file named
// after the program and exits 1).
bool PrintHelpIfAsked(int argc, char** argv) {
  bool asked = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-help" || a == "-h") asked = true;
  }
  if (!asked) return false;
  std::printf("%s\n\n", std::string(absl::ProgramUsageMessage()).c_str());
  std::map<std::string, const absl::CommandLineFlag*> ours;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->Filename().find("operator/main.cc") != std::string::npos)
      ours[std::string(flag->Name())] = flag;
  }
  for (const auto& [name, flag] : ours) {
    std::printf("  --%s (%s); default: %s\n", name.c_str(), flag->Help().c_str(),
                flag->DefaultValue().c_str());
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "sluice-operator --cluster_pool_ipv4_pod_cidr_list=CIDR[,CIDR] "
      "[--cluster_pool_ipv4_mask_size=N] [flags]: cluster-pool IPAM, writes each Node's "
      "spec.podCIDR");
  if (PrintHelpIfAsked(argc, argv)) return 0;
  // --version as every other binary answers it (abseil's own prints no version or commit).
  for (int i = 1; i < argc && std::string_view(argv[i]) != "--"; ++i) {
    if (std::string_view(argv[i]) == "--version" || std::string_view(argv[i]) == "-version") {
      std::printf("sluice-operator %s\n", SLUICE_VERSION_STRING);
      return 0;
    }
  }
  absl::ParseCommandLine(argc, argv);
  using sluice::agent::ClusterPool;
  using sluice::agent::IpPrefix;

  std::vector<IpPrefix> pools;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_cluster_pool_ipv4_pod_cidr_list),
                                            ',', absl::SkipWhitespace())) {
    auto p = IpPrefix::Parse(c);
    if (!p.ok()) return Fail(p.status(), "--cluster_pool_ipv4_pod_cidr_list");
    pools.push_back(*p);
  }
  auto pool = ClusterPool::Make(std::move(pools), absl::GetFlag(FLAGS_cluster_pool_ipv4_mask_size));
  if (!pool.ok()) return Fail(pool.status(), "cluster pool");

  sluice::agent::OperatorOptions opts;
  opts.pool = *pool;
  opts.lease_namespace = absl::GetFlag(FLAGS_leader_election_namespace);
  opts.lease_name = absl::GetFlag(FLAGS_lease_name);
  opts.election.identity = absl::GetFlag(FLAGS_identity);
  if (opts.election.identity.empty()) opts.election.identity = DefaultIdentity();
  opts.election.lease_duration = absl::GetFlag(FLAGS_lease_duration);
  opts.election.renew_deadline = absl::GetFlag(FLAGS_renew_deadline);
  opts.election.retry_period = absl::GetFlag(FLAGS_retry_period);
  if (absl::Status s = opts.election.Validate(); !s.ok()) return Fail(s, "leader election");

  sluice::k8s::ConfigOptions config;
  config.kubeconfig = absl::GetFlag(FLAGS_kubeconfig);
  config.k8s_service_host = absl::GetFlag(FLAGS_k8s_service_host);
  config.k8s_service_port = absl::GetFlag(FLAGS_k8s_service_port);
  auto client_config = sluice::k8s::LoadClientConfig(config);
  if (!client_config.ok()) return Fail(client_config.status(), "apiserver configuration");
  sluice::k8s::HttpClient::Options http_options;
  http_options.user_agent = "sluice-operator";
  sluice::k8s::HttpClient http(*client_config, http_options, nullptr);

  // SIGTERM/SIGINT: stop and release the Lease so a follower takes over at once.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  spdlog::info("sluice-operator {} on {}: lease {}/{}", opts.election.identity,
               client_config->server, opts.lease_namespace, opts.lease_name);
  sluice::agent::Operator op(&http, opts);
  // Declared after op: the servers stop before the Operator they read goes.
  sluice::metrics::Registry registry;
  sluice::agent::AddOperatorCollector(op, registry);
  const std::string health = absl::GetFlag(FLAGS_health_address);
  const std::string metrics = absl::GetFlag(FLAGS_metrics_address);
  std::vector<std::unique_ptr<sluice::metrics::HttpServer>> servers;
  if (!health.empty()) {
    std::vector<sluice::metrics::Route> routes = sluice::agent::OperatorHealthRoutes(op);
    if (metrics == health) routes.push_back(sluice::metrics::MetricsRoute(registry));
    auto s = sluice::metrics::HttpServer::Start(health, std::move(routes));
    if (!s.ok()) return Fail(s.status(), "--health_address");
    servers.push_back(std::move(*s));
  }
  if (!metrics.empty() && metrics != health) {
    auto s = sluice::metrics::HttpServer::Start(metrics, {sluice::metrics::MetricsRoute(registry)});
    if (!s.ok()) return Fail(s.status(), "--metrics_address");
    servers.push_back(std::move(*s));
  }
  op.Start();
  std::thread([&op, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("sluice-operator: signal {}: stopping", sig);
    op.Stop(true);
  }).detach();
  if (op.Wait() == sluice::agent::LeaderElector::State::kLost) {
    spdlog::critical("sluice-operator: lost the lease; exiting");
    std::_Exit(1);
  }
  op.Stop(true);
  return 0;
}
