// Control-plane latency and memory of the agent's Service stack at 10,000 Services x 10
// endpoints, through the real pieces: the lab apiserver over HTTPS -> KubernetesState (all six
// reflectors, kube-proxy's label selector) -> ServiceSync (store listeners, coalesced apply on
// its own thread) -> ServiceReconciler -> BpfLbMaps on the pinned maps of a Datapath loaded on a
// scratch bpffs. Nothing is attached: "serving" is read back from sluice_lb4_svc / sluice_lb4_be.
//
//   1. initial sync: wall clock from KubernetesState::Start (and ServiceSync right after it, as
//      the agent does) to ServiceSync::WaitIdle (every Service applied, stale state pruned).
//      It includes the HTTPS lists of every kind; the time to the last first-list (WaitForSync)
//      is printed apart. Then every Service is verified in the maps (master count 10, the 10
//      backend addresses in its slots).
//   2. memory: VmRSS before KubernetesState::Start (the Datapath already loaded; its maps are
//      kernel memory) and, after the sync, VmHWM (peak; reset through /proc/self/clear_refs
//      right before the start) and VmRSS (steady), from /proc/self/status.
//   3. single-change latency (last repetition only): ~100 EndpointSlice PUTs/s for --seconds,
//      each adding or removing one endpoint of a random Service (2..20 endpoints kept). Per
//      change, the time from the PUT returning (HTTP 200) to the maps serving exactly the new
//      endpoint set: master count == endpoints and the slots' backends == the new addresses. A
//      prober thread re-reads pending Services every 100 us (so figures have ~0.1 ms
//      granularity); a Service is not changed again while its previous change is pending.
//      Also from the PUT being sent, and split: PUT sent -> the event in the agent's
//      EndpointSlice store (a listener after ServiceSync's) -> the master entry written (a
//      BpfLbMaps subclass stamps it) -> seen by the prober. The lab apiserver's sockets get
//      TCP_NODELAY first, as kube-apiserver's have (see SetNoDelayOnOpenSockets).
//
// The apiserver runs in a forked child (as k8s_sync_bench); each repetition runs in a fresh
// forked child so its RSS is clean. The writer and prober exist only after the memory figures.
//
// usage: service_churn_bench [--reps=3] [--seconds=15] [--rate=100] [--nagle] [--sync-after-list]
//   --nagle            leave the lab apiserver's sockets as they are (no TCP_NODELAY)
//   --sync-after-list  construct ServiceSync after every kind has listed (the agent constructs it
//                      while the lists run)
//   --ct-flows=N       before the churn, fill sluice_ct4 with N established TCP flows (2N
//                      entries) of an unrelated Service, as on a busy node (max 131072)
#include <arpa/inet.h>
#include <curl/curl.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/child_pipe.h"
#include "bench/tcp_nodelay.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/k8s/watches.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/store/object_store.h"
#include "agent/lab/tools/kubeconfig.h"
#include "agent/service/reconciler.h"
#include "agent/service/sync.h"
#include "loader/datapath.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "support/fixture.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kServices = 10'000;
constexpr int kEndpointsPerSlice = 10;
constexpr char kNamespace[] = "bench";
constexpr int kMaxChanges = 8192;
constexpr int kMinEndpoints = 2, kMaxEndpoints = 20;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "service_churn_bench: %s\n", msg.c_str());
  std::_Exit(2);
}

using sluice::bench::ReadAll;
using sluice::bench::ReadString;
using sluice::bench::SetNoDelayOnOpenSockets;
using sluice::bench::WriteAll;
using sluice::bench::WriteString;

// ---- memory ----------------------------------------------------------------------------------

// A "VmXXX:" field of /proc/self/status, KiB.
int64_t StatusKiB(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  size_t n = std::strlen(field);
  while (std::getline(f, line)) {
    if (line.compare(0, n, field) == 0) return std::strtoll(line.c_str() + n, nullptr, 10);
  }
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0).
bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return f.good();
}

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// ---- the cluster -----------------------------------------------------------------------------

std::string SvcName(int i) { return absl::StrFormat("svc-%05d", i); }
std::string SliceName(int i) { return absl::StrCat(SvcName(i), "-x7k2p"); }

json ServiceObject(int i) {
  std::string name = SvcName(i);
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", {{"name", name}, {"namespace", kNamespace}, {"labels", {{"app", name}}}}},
          {"spec",
           {{"type", "ClusterIP"},
            {"selector", {{"app", name}}},
            {"ports",
             json::array(
                 {{{"name", "http"}, {"protocol", "TCP"}, {"port", 80}, {"targetPort", 8080}}})}}}};
}

// Initial endpoint j of Service i: 10.244.0.0/14; endpoints added later: 10.248.0.0/14.
uint32_t InitialEndpoint(int i, int j) {
  return (10u << 24) + (244u << 16) + static_cast<uint32_t>(i * kEndpointsPerSlice + j);
}
constexpr uint32_t kAddedBase = (10u << 24) + (248u << 16);

std::string Dotted(uint32_t host_order) {
  return absl::StrCat(host_order >> 24, ".", (host_order >> 16) & 255, ".", (host_order >> 8) & 255,
                      ".", host_order & 255);
}

json SliceObject(int i, const std::vector<uint32_t>& addrs) {
  std::string svc = SvcName(i);
  json endpoints = json::array();
  for (uint32_t a : addrs) {
    endpoints.push_back(
        {{"addresses", json::array({Dotted(a)})},
         {"conditions", {{"ready", true}, {"serving", true}, {"terminating", false}}},
         {"nodeName", absl::StrCat("node-", a % 100)},
         {"zone", absl::StrCat("zone-", a % 3)},
         {"targetRef",
          {{"kind", "Pod"},
           {"namespace", kNamespace},
           {"name", absl::StrCat(svc, "-pod-", a)},
           {"uid", absl::StrFormat("00000000-0000-4000-8000-%012u", a)}}}});
  }
  return {{"apiVersion", "discovery.k8s.io/v1"},
          {"kind", "EndpointSlice"},
          {"metadata",
           {{"name", SliceName(i)},
            {"namespace", kNamespace},
            {"labels",
             {{"kubernetes.io/service-name", svc},
              {"endpointslice.kubernetes.io/managed-by", "endpointslice-controller.k8s.io"}}}}},
          {"addressType", "IPv4"},
          {"endpoints", endpoints},
          {"ports", json::array({{{"name", "http"}, {"protocol", "TCP"}, {"port", 8080}}})}};
}

std::vector<uint32_t> InitialEndpoints(int i) {
  std::vector<uint32_t> v;
  for (int j = 0; j < kEndpointsPerSlice; ++j) v.push_back(InitialEndpoint(i, j));
  return v;
}

[[noreturn]] void ServerChild(int out_fd, int stop_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  spdlog::set_level(spdlog::level::warn);
  sluice::lab::ApiServerOptions o;
  o.run_controllers = false;  // nothing but the benchmark writes slices
  o.history_limit = 4 * (kServices * 2 + 100) + 2 * kMaxChanges;
  o.worker_threads = 32;
  sluice::lab::ApiServer server(o);
  if (absl::Status s = server.Start(); !s.ok()) Die(absl::StrCat("apiserver: ", s.ToString()));
  auto& store = server.store();
  using sluice::lab::Resource;
  auto ns = store.Create(
      Resource("namespaces"),
      {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kNamespace}}}});
  if (!ns.ok()) Die(absl::StrCat("namespace: ", ns.status().ToString()));
  for (int i = 0; i < kServices; ++i) {
    auto r = store.Create(Resource("services"), ServiceObject(i));
    if (!r.ok()) Die(absl::StrCat("service ", i, ": ", r.status().ToString()));
    auto e = store.Create(Resource("endpointslices"), SliceObject(i, InitialEndpoints(i)));
    if (!e.ok()) Die(absl::StrCat("slice ", i, ": ", e.status().ToString()));
  }
  WriteString(out_fd, server.url());
  WriteString(out_fd, server.token());
  WriteString(out_fd, server.ca_cert_pem());
  // Commands: 'n' = TCP_NODELAY on every open TCP socket (answers how many); EOF = stop.
  while (true) {
    char c;
    ssize_t n = ::read(stop_fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (c == 'n') {
      int32_t count = SetNoDelayOnOpenSockets();
      WriteAll(out_fd, &count, sizeof count);
    }
  }
  server.Stop();
  std::_Exit(0);
}

struct Server {
  std::string url, token, ca;
  int command_fd = -1, reply_fd = -1;  // to / from the server child
  bool nodelay = true;
};

// ---- the probe -------------------------------------------------------------------------------

// The backend addresses (host order, sorted) the maps serve for `frontend`, or nullopt when the
// master is absent. Reads the master's count, then each slot and its backend.
std::optional<std::vector<uint32_t>> Served(sluice::loader::Datapath& dp,
                                            const sluice_lb4_key& frontend) {
  sluice_lb4_key k = frontend;
  k.backend_slot = 0;
  auto master = dp.lb4_services().Lookup(k);
  if (!master.ok()) return std::nullopt;
  std::vector<uint32_t> out;
  for (uint16_t s = 1; s <= master->count; ++s) {
    k.backend_slot = s;
    auto slot = dp.lb4_services().Lookup(k);
    if (!slot.ok()) return std::nullopt;
    auto be = dp.lb4_backends().Lookup(slot->backend_id);
    if (!be.ok()) return std::nullopt;
    out.push_back(ntohl(be->addr));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- one repetition --------------------------------------------------------------------------

struct Result {
  int ok = 0;
  char error[256] = {};
  // initial sync
  double baseline_rss_mib = 0;      // VmRSS before KubernetesState::Start (Datapath loaded)
  double pre_load_rss_mib = 0;      // VmRSS before Datapath::Load
  double listed_s = 0;              // every kind's first list done (WaitForSync)
  double programmed_s = 0;          // ServiceSync idle and pruned
  double cpu_s = 0;                 // process CPU (user + sys) over the sync, all threads
  double hwm_mib = 0, rss_mib = 0;  // after the sync
  double listed_rss_mib = 0;        // after the lists, before ServiceSync (--sync-after-list)
  int64_t frontends = 0, backends = 0, verified = 0;
  // churn
  int changes = 0, missed = 0, put_errors = 0;
  int32_t nodelay_sockets = 0;  // server sockets given TCP_NODELAY before the churn
  double churn_s = 0, rss_after_churn_mib = 0;
  float from_return_ms[kMaxChanges] = {};
  float from_start_ms[kMaxChanges] = {};
  float put_ms[kMaxChanges] = {};
  float event_ms[kMaxChanges] = {};            // PUT sent -> event in the agent's store
  float event_to_served_ms[kMaxChanges] = {};  // event in the store -> maps serve it
  float event_to_master_ms[kMaxChanges] = {};  // event in the store -> master entry written
  char added[kMaxChanges] = {};                // 1: the change added an endpoint, 0: removed
  int ct_flows = 0;                            // TCP flows in sluice_ct4 during the churn
  double ct_fill_s = 0;
};

void Fail(Result* r, const std::string& msg) {
  r->ok = 0;
  std::snprintf(r->error, sizeof r->error, "%s", msg.c_str());
}

size_t CurlDiscard(char*, size_t size, size_t n, void*) { return size * n; }

struct Pending {
  int svc;
  bool added;
  std::vector<uint32_t> want;  // sorted
  Clock::time_point start, ret;
};

// When the agent's EndpointSlice store last applied a watch event of Service i's slice (steady
// clock ns): a listener registered after ServiceSync's, so it runs once the sync is notified.
std::vector<std::atomic<int64_t>> g_slice_event_ns(kServices);

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// When the reconciler last wrote Service i's master entry (steady clock ns): the moment a change
// is in the maps, told apart from the moment the prober saw it.
std::vector<std::atomic<int64_t>> g_master_write_ns(kServices);

// BpfLbMaps that stamps master writes of the benchmark's Services (once `by_addr` is filled).
// BpfLbMaps holds updates back until it flushes them as batches: the stamp is taken then.
class StampingLbMaps : public sluice::agent::BpfLbMaps {
 public:
  using BpfLbMaps::BpfLbMaps;
  absl::flat_hash_map<uint32_t, int> by_addr;  // ClusterIP (network order) -> Service index
  std::atomic<bool> armed{false};
  absl::Status UpdateService(const sluice_lb4_key& key, const sluice_lb4_service& v) override {
    if (armed.load(std::memory_order_acquire) && key.backend_slot == 0) {
      if (auto it = by_addr.find(key.addr); it != by_addr.end()) held_.push_back(it->second);
    }
    return BpfLbMaps::UpdateService(key, v);
  }
  absl::Status Flush() override {
    absl::Status st = BpfLbMaps::Flush();
    for (int i : held_) g_master_write_ns[i].store(NowNs());
    held_.clear();
    return st;
  }

 private:
  std::vector<int> held_;  // Services whose master is held back (the reconciler's thread only)
};

void Churn(const Server& srv, sluice::loader::Datapath& dp,
           const std::vector<sluice_lb4_key>& frontends, double seconds, double rate, Result* r) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Pending> pending;
  std::vector<char> busy(kServices, 0);  // a change of this Service is pending
  bool writer_done = false;
  std::atomic<int> done{0};

  std::thread prober([&] {
    std::unique_lock<std::mutex> l(mu);
    while (true) {
      cv.wait(l, [&] { return writer_done || !pending.empty(); });
      if (pending.empty() && writer_done) return;
      std::vector<Pending> now(pending.begin(), pending.end());
      l.unlock();
      std::vector<int> seen;
      auto t = Clock::now();
      for (const Pending& p : now) {
        auto served = Served(dp, frontends[p.svc]);
        bool hit = served && *served == p.want;
        bool expired = t - p.ret > std::chrono::seconds(5);
        if (!hit && !expired) continue;
        seen.push_back(p.svc);
        int idx = done.fetch_add(1);
        if (idx >= kMaxChanges) continue;
        if (hit) {
          auto ev = Clock::time_point(std::chrono::nanoseconds(g_slice_event_ns[p.svc].load()));
          r->event_ms[idx] =
              ev >= p.start ? std::chrono::duration<float, std::milli>(ev - p.start).count() : -1;
          r->event_to_served_ms[idx] =
              ev >= p.start ? std::chrono::duration<float, std::milli>(t - ev).count() : -1;
          auto mw = Clock::time_point(std::chrono::nanoseconds(g_master_write_ns[p.svc].load()));
          r->event_to_master_ms[idx] =
              ev >= p.start && mw >= ev ? std::chrono::duration<float, std::milli>(mw - ev).count()
                                        : -1;
          r->added[idx] = p.added;
          r->from_return_ms[idx] = std::chrono::duration<float, std::milli>(t - p.ret).count();
          r->from_start_ms[idx] = std::chrono::duration<float, std::milli>(t - p.start).count();
          r->put_ms[idx] = std::chrono::duration<float, std::milli>(p.ret - p.start).count();
        } else {
          r->from_return_ms[idx] = -1;
        }
      }
      l.lock();
      for (int s : seen) {
        busy[s] = 0;
        pending.erase(std::find_if(pending.begin(), pending.end(),
                                   [s](const Pending& p) { return p.svc == s; }));
      }
      if (!pending.empty()) {
        l.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        l.lock();
      }
    }
  });

  std::vector<std::vector<uint32_t>> eps(kServices);
  for (int i = 0; i < kServices; ++i) eps[i] = InitialEndpoints(i);
  std::mt19937 rng(42);
  uint32_t next_added = kAddedBase;

  CURL* easy = curl_easy_init();
  std::string auth = "Authorization: Bearer " + srv.token;
  curl_slist* headers = curl_slist_append(nullptr, auth.c_str());
  headers = curl_slist_append(headers, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Accept: application/json");
  // No "Expect: 100-continue" (curl adds it to bodies over 1 KiB): one round trip per PUT.
  headers = curl_slist_append(headers, "Expect:");
  curl_blob ca{const_cast<char*>(srv.ca.data()), srv.ca.size(), CURL_BLOB_COPY};
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, long(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(easy, CURLOPT_CAINFO_BLOB, &ca);
  curl_easy_setopt(easy, CURLOPT_CAPATH, nullptr);
  curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, "PUT");
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &CurlDiscard);
  curl_easy_setopt(easy, CURLOPT_TIMEOUT, 10L);

  auto put = [&](int svc, const std::vector<uint32_t>& e, long* status) {
    std::string body = SliceObject(svc, e).dump();
    std::string url = absl::StrCat(srv.url, "/apis/discovery.k8s.io/v1/namespaces/", kNamespace,
                                   "/endpointslices/", SliceName(svc));
    curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    CURLcode rc = curl_easy_perform(easy);
    *status = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, status);
    return rc;
  };
  // Untimed: open the writer's connection (an unchanged slice), then, unless --nagle, have the
  // server child set TCP_NODELAY on its sockets (the watches' and this one).
  long status = 0;
  if (CURLcode rc = put(0, eps[0], &status); rc != CURLE_OK || status != 200) {
    Fail(r, absl::StrCat("warm-up PUT: ", curl_easy_strerror(rc), " HTTP ", status));
  }
  if (srv.nodelay) {
    WriteAll(srv.command_fd, "n", 1);
    if (!ReadAll(srv.reply_fd, &r->nodelay_sockets, sizeof r->nodelay_sockets, 10))
      Fail(r, "server child did not answer the TCP_NODELAY command");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the warm-up change applied
  const int total = std::min(kMaxChanges, static_cast<int>(seconds * rate));
  const auto t0 = Clock::now();
  for (int c = 0; c < total; ++c) {
    // Open loop: change c is due at t0 + c / rate (late changes go at once).
    std::this_thread::sleep_until(t0 +
                                  std::chrono::microseconds(static_cast<int64_t>(c * 1e6 / rate)));
    int svc;
    {
      std::lock_guard<std::mutex> l(mu);
      do {
        svc = static_cast<int>(rng() % kServices);
      } while (busy[svc]);
      busy[svc] = 1;
    }
    std::vector<uint32_t>& e = eps[svc];
    bool add = e.size() <= kMinEndpoints ? true : e.size() >= kMaxEndpoints ? false : (rng() & 1);
    if (add) {
      e.push_back(next_added++);
    } else {
      e.erase(e.begin() + rng() % e.size());
    }
    auto start = Clock::now();
    CURLcode rc = put(svc, e, &status);
    auto ret = Clock::now();
    std::lock_guard<std::mutex> l(mu);
    if (rc != CURLE_OK || status != 200) {
      ++r->put_errors;
      busy[svc] = 0;
      continue;
    }
    std::vector<uint32_t> want = e;
    std::sort(want.begin(), want.end());
    pending.push_back({svc, add, std::move(want), start, ret});
    ++r->changes;
    cv.notify_one();
  }
  {
    std::lock_guard<std::mutex> l(mu);
    writer_done = true;
    cv.notify_one();
  }
  prober.join();
  r->churn_s = std::chrono::duration<double>(Clock::now() - t0).count();
  curl_slist_free_all(headers);
  curl_easy_cleanup(easy);
  int n = std::min(done.load(), kMaxChanges);
  for (int i = 0; i < n; ++i) {
    if (r->from_return_ms[i] < 0) ++r->missed;
  }
}

void RunOnce(const Server& srv, bool churn, double seconds, double rate, bool sync_after_list,
             int ct_flows, Result* r) {
  using namespace sluice;
  r->pre_load_rss_mib = StatusKiB("VmRSS:") / 1024.0;
  sluice::testing::ScratchBpffs bpffs;
  auto dp = loader::Datapath::Load(bpffs.path());
  if (!dp.ok()) return Fail(r, absl::StrCat("Datapath::Load: ", dp.status().ToString()));
  std::string kubeconfig = absl::StrCat(bpffs.path(), ".kubeconfig");
  lab::KubeconfigParams kp;
  kp.server = srv.url;
  kp.ca_cert_pem = srv.ca;
  kp.token = srv.token;
  if (auto st = lab::WriteKubeconfig(kubeconfig, kp); !st.ok())
    return Fail(r, absl::StrCat("kubeconfig: ", st.ToString()));
  agent::KubernetesOptions ko;
  ko.config.kubeconfig = kubeconfig;
  ko.node_name = "node-0";
  StampingLbMaps lb_maps((*dp)->lb4_services(), (*dp)->lb4_backends(), (*dp)->lb4_revnat(),
                         (*dp)->lb4_source_ranges(), (*dp)->ct4_any(), &(*dp)->lb4_affinity(),
                         &(*dp)->ct4(), &(*dp)->lb4_non_backend_ports(),
                         &(*dp)->lb4_slot_records());

  r->baseline_rss_mib = StatusKiB("VmRSS:") / 1024.0;
  if (!ResetPeakRss()) return Fail(r, "cannot reset VmHWM through /proc/self/clear_refs");
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  auto k8s = agent::KubernetesState::Start(ko);
  if (!k8s.ok()) return Fail(r, absl::StrCat("KubernetesState: ", k8s.status().ToString()));
  agent::KubernetesState* kube = k8s->get();
  auto rec = agent::ServiceReconciler::Create(lb_maps);
  if (!rec.ok()) return Fail(r, absl::StrCat("ServiceReconciler: ", rec.status().ToString()));
  auto make_sync = [&] {
    return std::make_unique<agent::ServiceSync>(
        kube->services(), kube->endpoint_slices(), [kube] { return kube->services().HasSynced() && kube->endpoint_slices().HasSynced(); }, **rec,
        nullptr, agent::NodeContext{"node-0", {}});
  };
  // As the agent: ServiceSync starts while the lists run (unless --sync-after-list).
  std::unique_ptr<agent::ServiceSync> sync;
  if (!sync_after_list) sync = make_sync();
  std::thread lister([&] {
    if (kube->WaitForSync(absl::Minutes(5)))
      r->listed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  if (sync_after_list) {
    lister.join();
    r->listed_rss_mib = StatusKiB("VmRSS:") / 1024.0;  // KubernetesState alone
    sync = make_sync();
  }
  bool idle = sync->WaitIdle(absl::Minutes(5));
  r->programmed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r->cpu_s = CpuSeconds() - cpu0;
  if (lister.joinable()) lister.join();
  r->hwm_mib = StatusKiB("VmHWM:") / 1024.0;
  r->rss_mib = StatusKiB("VmRSS:") / 1024.0;
  if (!idle) return Fail(r, "ServiceSync not idle within 5 minutes");

  // Verify every Service (untimed) and keep its frontend key for the churn.
  agent::ServiceReconcilerStats st = (*rec)->stats();
  r->frontends = static_cast<int64_t>(st.frontends);
  r->backends = static_cast<int64_t>(st.backends);
  std::vector<sluice_lb4_key> frontends(kServices);
  for (int i = 0; i < kServices; ++i) {
    auto svc = kube->services().Get(absl::StrCat(kNamespace, "/", SvcName(i)));
    if (svc == nullptr || svc->cluster_ips.empty())
      return Fail(r, absl::StrCat("no ClusterIP for ", SvcName(i)));
    in_addr a{};
    if (inet_pton(AF_INET, svc->cluster_ips[0].c_str(), &a) != 1)
      return Fail(r, absl::StrCat("ClusterIP ", svc->cluster_ips[0]));
    sluice_lb4_key& k = frontends[i];
    k = {};
    k.addr = a.s_addr;
    k.dport = htons(80);
    k.proto = IPPROTO_TCP;
    k.scope = SLUICE_LB_SCOPE_EXTERNAL;
    auto served = Served(**dp, k);
    if (served && *served == InitialEndpoints(i)) ++r->verified;
  }
  if (r->verified != kServices)
    return Fail(r, absl::StrCat(r->verified, " of ", kServices, " Services served as listed"));
  for (int i = 0; i < kServices; ++i) lb_maps.by_addr[frontends[i].addr] = i;
  lb_maps.armed.store(true, std::memory_order_release);
  kube->endpoint_slices().AddListener([](const k8s::Change<k8s::EndpointSlice>& c) {
    if (c.new_obj == nullptr) return;
    int i = -1;
    if (std::sscanf(c.new_obj->meta.name.c_str(), "svc-%d-", &i) == 1 && i >= 0 && i < kServices)
      g_slice_event_ns[i].store(NowNs());
  });
  if (churn) {
    // Established TCP flows of unrelated Services (2 entries each), as a busy node holds them.
    // The reconciler's conntrack flush walks only sluice_ct4_any (UDP), so they cost nothing.
    const auto f0 = Clock::now();
    for (int f = 0; f < ct_flows; ++f) {
      sluice_ct4_key k{};
      k.saddr = htonl((10u << 24) + (200u << 16) + static_cast<uint32_t>(f / 60000));
      k.daddr = htonl((172u << 24) + (31u << 16) + 1);
      k.sport = htons(static_cast<uint16_t>(1024 + f % 60000));
      k.dport = htons(80);
      k.proto = IPPROTO_TCP;
      sluice_ct4_entry e{};
      e.backend_id = 1;
      e.rev_nat_id = 1;
      for (uint8_t dir = 0; dir < 2; ++dir) {
        k.dir = dir;
        if (auto st = (*dp)->ct4().Update(k, e); !st.ok())
          return Fail(r, absl::StrCat("sluice_ct4 fill: ", st.ToString()));
      }
    }
    r->ct_flows = ct_flows;
    r->ct_fill_s = std::chrono::duration<double>(Clock::now() - f0).count();
    Churn(srv, **dp, frontends, seconds, rate, r);
    r->rss_after_churn_mib = StatusKiB("VmRSS:") / 1024.0;
  }
  r->ok = r->error[0] == '\0';
}

Result Measure(const Server& srv, bool churn, double seconds, double rate, bool sync_after_list,
               int ct_flows) {
  int fds[2];
  if (pipe(fds) != 0) Die("pipe");
  pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    spdlog::set_level(spdlog::level::warn);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    auto r = std::make_unique<Result>();
    RunOnce(srv, churn, seconds, rate, sync_after_list, ct_flows, r.get());
    WriteAll(fds[1], r.get(), sizeof(Result));
    std::_Exit(0);  // skip destructors: the result is out (the scratch bpffs goes with the child)
  }
  close(fds[1]);
  Result r;
  if (!ReadAll(fds[0], &r, sizeof r, 900)) {
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

// Nearest-rank percentile of a sorted vector.
double Pct(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t i = static_cast<size_t>(std::ceil(p / 100.0 * sorted.size()));
  return sorted[std::min(sorted.size() - 1, i == 0 ? 0 : i - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  double seconds = 15, rate = 100;
  bool nodelay = true, sync_after_list = false;
  int ct_flows = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--reps=", 0) == 0)
      reps = std::max(1, std::atoi(a.c_str() + 7));
    else if (a.rfind("--seconds=", 0) == 0)
      seconds = std::atof(a.c_str() + 10);
    else if (a.rfind("--rate=", 0) == 0)
      rate = std::atof(a.c_str() + 7);
    else if (a == "--nagle")
      nodelay = false;
    else if (a == "--sync-after-list")
      sync_after_list = true;
    else if (a.rfind("--ct-flows=", 0) == 0)
      ct_flows = std::atoi(a.c_str() + 11);
    else
      Die(absl::StrCat("unknown argument ", a,
                       " (--reps=N --seconds=S --rate=R --nagle --sync-after-list --ct-flows=N)"));
  }
  int up[2], stop[2];
  if (pipe(up) != 0 || pipe(stop) != 0) Die("pipe");
  const auto populate_t0 = Clock::now();
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
  srv.command_fd = stop[1];
  srv.reply_fd = up[0];
  srv.nodelay = nodelay;
  std::printf(
      "service_churn_bench: lab apiserver %s (pid %d) holds %d Services x %d endpoints "
      "in namespace %s (populated in %.1f s); %ld CPUs\n",
      srv.url.c_str(), static_cast<int>(server_pid), kServices, kEndpointsPerSlice, kNamespace,
      std::chrono::duration<double>(Clock::now() - populate_t0).count(),
      sysconf(_SC_NPROCESSORS_ONLN));
  std::fflush(stdout);

  std::vector<std::unique_ptr<Result>> results;
  bool ok = true;
  for (int rep = 0; rep < reps; ++rep) {
    bool churn = rep + 1 == reps;  // the churn rewrites slices: last repetition only
    auto r =
        std::make_unique<Result>(Measure(srv, churn, seconds, rate, sync_after_list, ct_flows));
    std::printf(
        "  rep %d  listed %.3f s  programmed %.3f s  cpu %.2f s  RSS base %.1f MiB "
        "(%.1f before Datapath::Load)  VmHWM %.1f  VmRSS %.1f MiB  frontends=%lld "
        "backends=%lld verified=%lld%s%s\n",
        rep + 1, r->listed_s, r->programmed_s, r->cpu_s, r->baseline_rss_mib, r->pre_load_rss_mib,
        r->hwm_mib, r->rss_mib, static_cast<long long>(r->frontends),
        static_cast<long long>(r->backends), static_cast<long long>(r->verified),
        r->ok ? "" : "  ERROR: ", r->error);
    std::fflush(stdout);
    if (!r->ok) {
      ok = false;
      break;
    }
    results.push_back(std::move(r));
  }
  close(stop[1]);
  kill(server_pid, SIGTERM);
  int status = 0;
  waitpid(server_pid, &status, 0);
  if (!ok) {
    std::fprintf(stderr, "service_churn_bench: failed run; no results\n");
    return 1;
  }

  std::vector<double> listed, programmed, cpu, hwm, rss;
  for (const auto& r : results) {
    listed.push_back(r->listed_s);
    programmed.push_back(r->programmed_s);
    cpu.push_back(r->cpu_s);
    hwm.push_back(r->hwm_mib - r->baseline_rss_mib);
    rss.push_back(r->rss_mib - r->baseline_rss_mib);
  }
  const Result& last = *results.back();
  std::printf(
      "\n#### initial sync, %d Services x %d endpoints, lab apiserver over HTTPS -> "
      "KubernetesState -> ServiceSync -> ServiceReconciler -> BPF maps, median of %d%s\n",
      kServices, kEndpointsPerSlice, static_cast<int>(results.size()),
      sync_after_list ? " (ServiceSync started after the lists)" : "");
  std::printf("%-52s %10.3f s\n", "start -> every kind listed (WaitForSync)", Median(listed));
  std::printf("%-52s %10.3f s\n", "start -> all Services programmed (WaitIdle)",
              Median(programmed));
  std::printf("%-52s %10.2f s\n", "process CPU over the sync (all threads)", Median(cpu));
  std::printf("%-52s %10.1f MiB\n", "VmHWM after sync - VmRSS before start", Median(hwm));
  std::printf("%-52s %10.1f MiB\n", "VmRSS after sync - VmRSS before start", Median(rss));
  if (sync_after_list) {
    std::vector<double> listed_rss;
    for (const auto& r : results) listed_rss.push_back(r->listed_rss_mib - r->baseline_rss_mib);
    std::printf("%-52s %10.1f MiB\n", "  of which KubernetesState after the lists",
                Median(listed_rss));
  }
  std::printf("%-52s %10.1f MiB\n", "VmRSS before start (Datapath loaded)", last.baseline_rss_mib);

  std::vector<double> lat, lat_start, put, event, event_to_served;
  int n = std::min(last.changes, kMaxChanges);
  for (int i = 0; i < n; ++i) {
    if (last.from_return_ms[i] < 0) continue;
    lat.push_back(last.from_return_ms[i]);
    lat_start.push_back(last.from_start_ms[i]);
    put.push_back(last.put_ms[i]);
    if (last.event_ms[i] >= 0) {
      event.push_back(last.event_ms[i]);
      event_to_served.push_back(last.event_to_served_ms[i]);
    }
  }
  std::vector<double> add_served, remove_served, to_master;
  for (int i = 0; i < n; ++i) {
    if (last.from_return_ms[i] < 0) continue;
    if (last.event_to_master_ms[i] >= 0) to_master.push_back(last.event_to_master_ms[i]);
    (last.added[i] ? add_served : remove_served).push_back(last.from_return_ms[i]);
  }
  for (auto* v :
       {&lat, &lat_start, &put, &event, &event_to_served, &add_served, &remove_served, &to_master})
    std::sort(v->begin(), v->end());
  std::printf(
      "\n#### single-change latency: %d EndpointSlice PUTs in %.1f s (%.0f/s asked), "
      "+/-1 endpoint each; %d not served within 5 s, %d PUT errors; apiserver %s\n",
      last.changes, last.churn_s, rate, last.missed, last.put_errors,
      srv.nodelay ? absl::StrCat("TCP_NODELAY (", last.nodelay_sockets, " sockets)").c_str()
                  : "with Nagle (the lab's default)");
  if (last.ct_flows > 0)
    std::printf("sluice_ct4 held %d TCP flows (%d entries; filled in %.2f s, untimed)\n",
                last.ct_flows, 2 * last.ct_flows, last.ct_fill_s);
  std::printf("%-40s %9s %9s %9s %9s\n", "ms", "p50", "p90", "p99", "max");
  auto row = [](const char* name, const std::vector<double>& v) {
    std::printf("%-40s %9.2f %9.2f %9.2f %9.2f\n", name, Pct(v, 50), Pct(v, 90), Pct(v, 99),
                v.empty() ? 0.0 : v.back());
  };
  row("PUT returned -> maps serve the change", lat);
  row("PUT sent -> maps serve the change", lat_start);
  row("PUT round trip (HTTPS, apiserver)", put);
  row("PUT sent -> event in the agent's store", event);
  row("event in the store -> maps serve it", event_to_served);
  row("  event -> master entry written", to_master);
  row("PUT returned -> served, endpoint added", add_served);
  row("PUT returned -> served, endpoint removed", remove_served);
  std::printf("VmRSS after the churn - before start: %.1f MiB\n",
              last.rss_after_churn_mib - last.baseline_rss_mib);
  return last.missed == 0 && last.put_errors == 0 ? 0 : 1;
}
