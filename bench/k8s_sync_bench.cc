// Initial-sync cost of the agent's Kubernetes client for 10,000 Services and 10,000
// EndpointSlices (100,000 endpoints), next to whole-response DOM parses of the same two lists
// measured in the same run. The claims are the ratios Sluice / baseline.
//
//   A  sluice:    the agent's HttpClient + two Reflectors (page_limit 500, streaming simdjson
//                 decode into the trimmed model) into two Stores; Start() until both HasSynced().
//   B  nlohmann:  libcurl GET of each collection UNPAGINATED (same TLS, CA and token) into one
//                 std::string, nlohmann::json::parse of the whole body (full DOM), walk it to count.
//   C  simdjson:  the same fetch, simdjson::dom::parser on the whole body (separates "streaming vs
//                 DOM" from "simdjson vs nlohmann").
//
// How the numbers are made:
// - The lab apiserver (run_controllers=false, so nothing rewrites the slices) runs in a forked
//   child that populates the store directly and serves on 127.0.0.1:<ephemeral>; port, token and
//   CA come back through a pipe. The parent stays small and single-threaded.
// - Every measurement runs in its own forked child so its peak RSS is clean: RSS delta =
//   getrusage(RUSAGE_SELF).ru_maxrss after the work minus VmRSS right before it. The result comes
//   back through a pipe. Both DOMs (B, C) are kept alive until the end, as A keeps both stores:
//   each variant ends holding its view of both collections. B/C free each body after parsing.
// - Time: wall clock from before the client is built to both collections counted (A: both stores
//   synced). 3 repetitions, interleaved A B C A B C ..., median time and median RSS delta.
// - Every run verifies 10,000 Services, 10,000 EndpointSlices and 100,000 endpoints in namespace
//   `bench` (the bootstrap `kubernetes` Service / slice in `default` are ignored); the program
//   exits non-zero if any count is wrong.
// Caveats: loopback TLS; the apiserver shares the machine's cores with the client (its JSON
// encoding is inside every time); A's two reflectors list concurrently on two threads, B/C fetch
// sequentially, as a naive client would.
#include <curl/curl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/child_pipe.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/k8s/config.h"
#include "agent/k8s/http_client.h"
#include "agent/k8s/reflector.h"
#include "agent/k8s/store.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/store/object_store.h"
#include "nlohmann/json.hpp"
#include "simdjson.h"
#include "spdlog/spdlog.h"

namespace {

using nlohmann::json;

constexpr int kServices = 10'000;
constexpr int kEndpointsPerSlice = 10;
constexpr int kEndpoints = kServices * kEndpointsPerSlice;
constexpr char kNamespace[] = "bench";
constexpr int kReps = 3;
constexpr char kServicesPath[] = "/api/v1/services";
constexpr char kSlicesPath[] = "/apis/discovery.k8s.io/v1/endpointslices";

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "k8s_sync_bench: %s\n", msg.c_str());
  std::_Exit(2);
}

using sluice::bench::ReadAll;
using sluice::bench::ReadString;
using sluice::bench::WriteAll;
using sluice::bench::WriteString;

// ---- memory ----------------------------------------------------------------------------------

int64_t CurrentRssKiB() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int64_t PeakRssKiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;  // KiB on Linux
}

// ---- server child ----------------------------------------------------------------------------

json ServiceObject(int i) {
  std::string name = absl::StrFormat("svc-%05d", i);
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", {{"name", name}, {"namespace", kNamespace}, {"labels", {{"app", name}}}}},
          {"spec",
           {{"type", "ClusterIP"},
            {"selector", {{"app", name}}},
            {"ports", json::array({{{"name", "http"},
                                    {"protocol", "TCP"},
                                    {"port", 80},
                                    {"targetPort", 8080}}})}}}};
}

json SliceObject(int i) {
  std::string svc = absl::StrFormat("svc-%05d", i);
  json endpoints = json::array();
  for (int j = 0; j < kEndpointsPerSlice; ++j) {
    int n = i * kEndpointsPerSlice + j;  // 10.244.0.0/14 pod addresses
    std::string ip = absl::StrCat("10.", 244 + (n >> 16), ".", (n >> 8) & 255, ".", n & 255);
    std::string pod = absl::StrCat(svc, "-pod-", j);
    endpoints.push_back(
        {{"addresses", json::array({ip})},
         {"conditions", {{"ready", true}, {"serving", true}, {"terminating", false}}},
         {"nodeName", absl::StrCat("node-", n % 100)},
         {"zone", absl::StrCat("zone-", n % 3)},
         {"targetRef",
          {{"kind", "Pod"},
           {"namespace", kNamespace},
           {"name", pod},
           {"uid", absl::StrFormat("00000000-0000-4000-8000-%012d", n)}}}});
  }
  return {{"apiVersion", "discovery.k8s.io/v1"},
          {"kind", "EndpointSlice"},
          {"metadata",
           {{"name", absl::StrCat(svc, "-x7k2p")},
            {"namespace", kNamespace},
            {"labels",
             {{"kubernetes.io/service-name", svc},
              {"endpointslice.kubernetes.io/managed-by", "endpointslice-controller.k8s.io"}}}}},
          {"addressType", "IPv4"},
          {"endpoints", endpoints},
          {"ports", json::array({{{"name", "http"}, {"protocol", "TCP"}, {"port", 8080}}})}};
}

// Never returns: populates, serves, hands port/token/CA to the parent, waits for SIGTERM / EOF.
[[noreturn]] void ServerChild(int out_fd, int stop_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  spdlog::set_level(spdlog::level::warn);
  sluice::lab::ApiServerOptions o;
  o.run_controllers = false;
  o.history_limit = 4 * (kServices * 2 + 100);
  o.worker_threads = 16;
  sluice::lab::ApiServer server(o);
  if (absl::Status s = server.Start(); !s.ok()) Die(absl::StrCat("apiserver: ", s.ToString()));
  auto& store = server.store();
  using sluice::lab::Resource;
  auto ns = store.Create(Resource("namespaces"),
                         {{"apiVersion", "v1"}, {"kind", "Namespace"},
                          {"metadata", {{"name", kNamespace}}}});
  if (!ns.ok()) Die(absl::StrCat("namespace: ", ns.status().ToString()));
  for (int i = 0; i < kServices; ++i) {
    auto r = store.Create(Resource("services"), ServiceObject(i));
    if (!r.ok()) Die(absl::StrCat("service ", i, ": ", r.status().ToString()));
    auto e = store.Create(Resource("endpointslices"), SliceObject(i));
    if (!e.ok()) Die(absl::StrCat("slice ", i, ": ", e.status().ToString()));
  }
  WriteString(out_fd, server.url());
  WriteString(out_fd, server.token());
  WriteString(out_fd, server.ca_cert_pem());
  char c;
  while (::read(stop_fd, &c, 1) < 0 && errno == EINTR) {
  }
  server.Stop();
  std::_Exit(0);
}

// ---- measurements ----------------------------------------------------------------------------

struct Result {
  int ok = 0;
  double seconds = 0;
  int64_t rss_delta_kib = 0;
  int64_t services = 0;
  int64_t slices = 0;
  int64_t endpoints = 0;
  uint64_t bytes = 0;  // response bytes received (B, C); list pages (A)
  char error[256] = {};
};

struct Server {
  std::string url, token, ca;
};

sluice::k8s::ClientConfig MakeConfig(const Server& s) {
  sluice::k8s::ClientConfig c;
  c.server = s.url;
  c.ca_pem = s.ca;
  c.token = s.token;
  c.source = "k8s_sync_bench";
  return c;
}

void Fail(Result* r, const std::string& msg) {
  r->ok = 0;
  std::snprintf(r->error, sizeof r->error, "%s", msg.c_str());
}

// Records time and peak RSS delta at the end of the timed work.
struct Stamp {
  std::chrono::steady_clock::time_point t0;
  int64_t rss0;
  void operator()(Result* r) const {
    r->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r->rss_delta_kib = PeakRssKiB() - rss0;
  }
};

void RunSluice(const Server& srv, Result* r, const Stamp& stamp) {
  using namespace sluice::k8s;
  HttpClient http(MakeConfig(srv));
  Store<Service> services;
  Store<EndpointSlice> slices;
  ReflectorOptions opts;
  opts.page_limit = 500;
  auto rs = MakeReflector(&http, &services, opts);
  auto re = MakeReflector(&http, &slices, opts);
  rs->Start();
  re->Start();
  if (!services.WaitSynced(absl::Minutes(5)) || !slices.WaitSynced(absl::Minutes(5))) {
    return Fail(r, "stores did not sync within 5 minutes");
  }
  for (const auto& s : services.List()) {
    if (s->meta.namespace_ == kNamespace && !s->cluster_ips.empty()) ++r->services;
  }
  for (const auto& e : slices.List()) {
    if (e->meta.namespace_ != kNamespace || e->service_name.empty()) continue;
    ++r->slices;
    r->endpoints += static_cast<int64_t>(e->endpoints.size());
  }
  stamp(r);  // stopping the watches is not timed
  ReflectorCounters cs = rs->counters(), ce = re->counters();
  r->bytes = cs.list_pages + ce.list_pages;
  r->ok = 1;
  if (cs.decode_errors + ce.decode_errors != 0) Fail(r, "reflector decode errors");
  rs->Stop();
  re->Stop();
}

size_t CurlWrite(char* p, size_t size, size_t n, void* ud) {
  static_cast<std::string*>(ud)->append(p, size * n);
  return size * n;
}

// One unpaginated GET into a string, the same TLS setup as HttpClient (CA blob, verify on).
bool Fetch(const Server& srv, const char* path, std::string* body, Result* r) {
  CURL* easy = curl_easy_init();
  std::string url = srv.url + path;
  std::string auth = "Authorization: Bearer " + srv.token;
  curl_slist* headers = curl_slist_append(nullptr, auth.c_str());
  headers = curl_slist_append(headers, "Accept: application/json");
  curl_blob ca{const_cast<char*>(srv.ca.data()), srv.ca.size(), CURL_BLOB_COPY};
  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, long(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(easy, CURLOPT_ACCEPT_ENCODING, "gzip");
  curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(easy, CURLOPT_CAINFO_BLOB, &ca);
  curl_easy_setopt(easy, CURLOPT_CAPATH, nullptr);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &CurlWrite);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, body);
  curl_easy_setopt(easy, CURLOPT_TIMEOUT, 300L);
  CURLcode rc = curl_easy_perform(easy);
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(easy);
  if (rc != CURLE_OK || status != 200) {
    Fail(r, absl::StrCat(path, ": curl ", curl_easy_strerror(rc), " HTTP ", status));
    return false;
  }
  r->bytes += body->size();
  return true;
}

void RunNlohmann(const Server& srv, Result* r, const Stamp& stamp) {
  std::vector<json> docs;  // both DOMs stay alive, as A keeps both stores
  {
    std::string body;
    if (!Fetch(srv, kServicesPath, &body, r)) return;
    docs.push_back(json::parse(body));
  }
  for (const json& item : docs.back().at("items")) {
    const json& md = item.at("metadata");
    if (md.value("namespace", "") == kNamespace && item.at("spec").contains("clusterIP")) {
      ++r->services;
    }
  }
  {
    std::string body;
    if (!Fetch(srv, kSlicesPath, &body, r)) return;
    docs.push_back(json::parse(body));
  }
  for (const json& item : docs.back().at("items")) {
    const json& md = item.at("metadata");
    if (md.value("namespace", "") != kNamespace) continue;
    if (!md.contains("labels") || !md["labels"].contains("kubernetes.io/service-name")) continue;
    ++r->slices;
    if (item.contains("endpoints")) r->endpoints += static_cast<int64_t>(item["endpoints"].size());
  }
  stamp(r);
  r->ok = 1;
}

void RunSimdjson(const Server& srv, Result* r, const Stamp& stamp) {
  // One parser per document: a dom::element lives in its parser, so both DOMs stay alive.
  simdjson::dom::parser sp, ep;
  simdjson::dom::element services, slices;
  {
    std::string body;
    if (!Fetch(srv, kServicesPath, &body, r)) return;
    if (sp.parse(body).get(services) != simdjson::SUCCESS) return Fail(r, "simdjson services");
  }
  for (simdjson::dom::element item : services["items"].get_array()) {
    std::string_view ns;
    if (item["metadata"]["namespace"].get(ns) != simdjson::SUCCESS || ns != kNamespace) continue;
    if (item["spec"]["clusterIP"].error() == simdjson::SUCCESS) ++r->services;
  }
  {
    std::string body;
    if (!Fetch(srv, kSlicesPath, &body, r)) return;
    if (ep.parse(body).get(slices) != simdjson::SUCCESS) return Fail(r, "simdjson slices");
  }
  for (simdjson::dom::element item : slices["items"].get_array()) {
    std::string_view ns;
    if (item["metadata"]["namespace"].get(ns) != simdjson::SUCCESS || ns != kNamespace) continue;
    if (item["metadata"]["labels"]["kubernetes.io/service-name"].error() != simdjson::SUCCESS) {
      continue;
    }
    ++r->slices;
    simdjson::dom::array eps;
    if (item["endpoints"].get(eps) == simdjson::SUCCESS) r->endpoints += eps.size();
  }
  stamp(r);
  r->ok = 1;
}

enum Variant { kSluice, kNlohmann, kSimdjson, kVariants };
const char* const kNames[kVariants] = {"A sluice (paged 500, streaming)",
                                       "B curl + nlohmann DOM",
                                       "C curl + simdjson DOM"};

// Runs one measurement in a fresh child; returns its result.
Result Measure(Variant v, const Server& srv) {
  int fds[2];
  if (pipe(fds) != 0) Die("pipe");
  pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    spdlog::set_level(spdlog::level::warn);
    curl_global_init(CURL_GLOBAL_DEFAULT);  // outside the window (HttpClient does it once too)
    Result r;
    const Stamp stamp{std::chrono::steady_clock::now(), CurrentRssKiB()};
    try {
      switch (v) {
        case kSluice: RunSluice(srv, &r, stamp); break;
        case kNlohmann: RunNlohmann(srv, &r, stamp); break;
        case kSimdjson: RunSimdjson(srv, &r, stamp); break;
        default: break;
      }
    } catch (const std::exception& e) {
      Fail(&r, e.what());
    }
    WriteAll(fds[1], &r, sizeof r);
    std::_Exit(0);  // skip destructors: the result is out
  }
  close(fds[1]);
  Result r;
  if (!ReadAll(fds[0], &r, sizeof r, 600)) {
    kill(pid, SIGKILL);
    Fail(&r, "measurement child died or timed out");
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  // Server first, before this process allocates anything big or starts a thread.
  int up[2], stop[2];
  if (pipe(up) != 0 || pipe(stop) != 0) Die("pipe");
  const auto populate_t0 = std::chrono::steady_clock::now();
  pid_t server_pid = fork();
  if (server_pid < 0) Die("fork");
  if (server_pid == 0) {
    close(up[0]);
    close(stop[1]);
    ServerChild(up[1], stop[0]);
  }
  close(up[1]);
  close(stop[0]);
  Server srv;
  srv.url = ReadString(up[0], 600);
  srv.token = ReadString(up[0], 10);
  srv.ca = ReadString(up[0], 10);
  const double populate_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - populate_t0).count();
  std::printf("k8s_sync_bench: lab apiserver %s (pid %d) holds %d Services, %d EndpointSlices, "
              "%d endpoints in namespace %s (populated in %.1f s); %ld CPUs\n",
              srv.url.c_str(), static_cast<int>(server_pid), kServices, kServices, kEndpoints,
              kNamespace, populate_s, sysconf(_SC_NPROCESSORS_ONLN));
  std::fflush(stdout);

  std::vector<Result> results[kVariants];
  bool ok = true;
  for (int rep = 0; rep < kReps && ok; ++rep) {
    for (int v = 0; v < kVariants; ++v) {
      Result r = Measure(static_cast<Variant>(v), srv);
      std::printf("  rep %d %-34s %7.3f s  %8.1f MiB  services=%lld slices=%lld endpoints=%lld%s%s\n",
                  rep + 1, kNames[v], r.seconds, r.rss_delta_kib / 1024.0,
                  static_cast<long long>(r.services), static_cast<long long>(r.slices),
                  static_cast<long long>(r.endpoints), r.ok ? "" : "  ERROR: ", r.error);
      std::fflush(stdout);
      if (!r.ok || r.services != kServices || r.slices != kServices || r.endpoints != kEndpoints) {
        ok = false;
        break;
      }
      results[v].push_back(r);
    }
  }
  close(stop[1]);  // the server child exits on EOF
  kill(server_pid, SIGTERM);
  int status = 0;
  waitpid(server_pid, &status, 0);
  if (!ok) {
    std::fprintf(stderr, "k8s_sync_bench: wrong counts or failed run; no results\n");
    return 1;
  }

  double t[kVariants], m[kVariants];
  for (int v = 0; v < kVariants; ++v) {
    std::vector<double> ts, ms;
    for (const Result& r : results[v]) {
      ts.push_back(r.seconds);
      ms.push_back(r.rss_delta_kib / 1024.0);
    }
    t[v] = Median(ts);
    m[v] = Median(ms);
  }
  std::printf("\n#### initial sync, %d Services + %d EndpointSlices (%d endpoints), median of %d\n",
              kServices, kServices, kEndpoints, kReps);
  std::printf("%-34s %10s %18s\n", "client", "time (s)", "peak RSS +MiB");
  for (int v = 0; v < kVariants; ++v) std::printf("%-34s %10.3f %18.1f\n", kNames[v], t[v], m[v]);
  std::printf("\n%-34s %10s %18s\n", "ratio", "time", "peak RSS");
  std::printf("%-34s %10.2f %18.2f\n", "sluice / nlohmann DOM (baseline)", t[kSluice] / t[kNlohmann],
              m[kSluice] / m[kNlohmann]);
  std::printf("%-34s %10.2f %18.2f\n", "sluice / simdjson DOM", t[kSluice] / t[kSimdjson],
              m[kSluice] / m[kSimdjson]);
  std::printf("(list pages fetched by A: %llu; unpaginated bytes fetched by B: %.1f MiB)\n",
              static_cast<unsigned long long>(results[kSluice][0].bytes),
              results[kNlohmann][0].bytes / 1048576.0);
  return 0;
}
