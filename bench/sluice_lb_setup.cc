// Programs the Sluice datapath for the Service benchmarks (service_conn_bench.sh,
// service_program_bench.sh): loads the real Datapath on a bpffs, writes the pods' endpoint
// entries as the agent's BpfEndpointDatapath does (endpoint entry first, then the program on the
// pod's host-side veth), programs N Services through the map API in the agent's hitless order
// (lb_cluster.h), and reports how long that took and the BPF maps' memlock.
//
// usage: sluice_lb_setup --bpffs=DIR --services=N --per-service=E
//          [--endpoint=IP,HOST_IFNAME,POD_MAC,HOST_MAC]...   (pods; their host veths get
//                                                              sluice_from_pod attached)
//          [--probed=IP,IP,...]  (backends of the last Service, port 8080, instead of synthetic)
//          [--memlock]           (print bpftool's memlock of every map of this datapath)
// Run it in the node's network namespace (`ip netns exec`); the programs stay attached (TC
// filters hold them and their maps) after it exits.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <net/if.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lb_cluster.h"
#include "loader/datapath.h"
#include "support/fixture.h"
#include "support/packet.h"

namespace {

using sluice::bench::LbBackend;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "sluice_lb_setup: %s\n", what.c_str());
  std::exit(1);
}

struct PodSpec {
  uint32_t addr;
  std::string host_if;
  sluice::testing::Mac mac, host_mac;
};

std::vector<uint32_t> ProgMapIds(int prog_fd) {
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(prog_fd, &info, &len) != 0) Die("bpf_obj_get_info_by_fd");
  std::vector<uint32_t> ids(info.nr_map_ids);
  bpf_prog_info again{};
  again.nr_map_ids = info.nr_map_ids;
  again.map_ids = reinterpret_cast<uint64_t>(ids.data());
  len = sizeof(again);
  if (bpf_obj_get_info_by_fd(prog_fd, &again, &len) != 0) Die("bpf_obj_get_info_by_fd");
  ids.resize(again.nr_map_ids);
  return ids;
}

// `bpftool map show id ID` for one map: its name, type, max_entries and bytes_memlock.
std::string BpftoolShow(uint32_t id) {
  std::string cmd = absl::StrCat("bpftool map show id ", id, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) out += buf;
  pclose(p);
  return out;
}

uint64_t MemlockOf(const std::string& show) {
  auto at = show.find("memlock ");
  if (at == std::string::npos) return 0;
  return std::strtoull(show.c_str() + at + 8, nullptr, 10);
}

}  // namespace

int main(int argc, char** argv) {
  std::string bpffs;
  uint32_t services = 0, per_service = 3;
  std::vector<PodSpec> pods;
  std::vector<LbBackend> probed;
  bool memlock = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* flag) -> const char* {
      size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = val("--bpffs=")) {
      bpffs = v;
    } else if (const char* v = val("--services=")) {
      services = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    } else if (const char* v = val("--per-service=")) {
      per_service = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    } else if (const char* v = val("--endpoint=")) {
      std::vector<std::string> f = absl::StrSplit(v, ',');
      if (f.size() != 4) Die(absl::StrCat("bad --endpoint ", v));
      pods.push_back({sluice::testing::Ip4(f[0]), f[1], sluice::testing::ParseMac(f[2]),
                      sluice::testing::ParseMac(f[3])});
    } else if (const char* v = val("--probed=")) {
      for (const std::string& ip : std::vector<std::string>(absl::StrSplit(v, ',')))
        probed.push_back({0, sluice::testing::Ip4(ip), sluice::bench::kBackendPort});
    } else if (a == "--memlock") {
      memlock = true;
    } else {
      Die(absl::StrCat("unknown argument ", a));
    }
  }
  if (bpffs.empty() || services == 0) Die("need --bpffs and --services");
  for (size_t j = 0; j < probed.size(); ++j)
    probed[j].id = (services - 1) * per_service + static_cast<uint32_t>(j) + 1;

  auto t0 = std::chrono::steady_clock::now();
  auto dp = sluice::loader::Datapath::Load(bpffs);
  if (!dp.ok()) Die(absl::StrCat("Datapath::Load: ", dp.status().ToString()));
  auto t1 = std::chrono::steady_clock::now();

  for (size_t i = 0; i < pods.size(); ++i) {
    const auto& p = pods[i];
    int ifindex = static_cast<int>(if_nametoindex(p.host_if.c_str()));
    if (ifindex == 0) Die(absl::StrCat("no interface ", p.host_if));
    if (auto st = sluice::testing::AddEndpoint(**dp, p.addr, ifindex, p.mac, p.host_mac,
                                       static_cast<uint32_t>(i + 1));
        !st.ok())
      Die(absl::StrCat("endpoint ", p.host_if, ": ", st.ToString()));
    if (auto st = (*dp)->AttachPod(ifindex); !st.ok())
      Die(absl::StrCat("attach ", p.host_if, ": ", st.ToString()));
  }

  auto t2 = std::chrono::steady_clock::now();
  if (auto st = sluice::bench::ProgramCluster(**dp, services, per_service, probed); !st.ok())
    Die(st.ToString());
  auto t3 = std::chrono::steady_clock::now();
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf("load_ms=%.1f program_ms=%.1f services=%u per_service=%u map_updates=%u\n",
              ms(t1 - t0), ms(t3 - t2), services, per_service, services * (2 * per_service + 2));

  if (memlock) {
    // Every map the datapath's programs use, found through the programs themselves (so maps
    // added later are counted without a change here).
    std::vector<uint32_t> ids;
    for (int prog : {(*dp)->from_pod_fd(), (*dp)->from_net_fd(), (*dp)->to_net_fd()}) {
      for (uint32_t id : ProgMapIds(prog))
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    uint64_t total = 0, lb = 0;
    for (uint32_t id : ids) {
      std::string show = BpftoolShow(id);
      uint64_t bytes = MemlockOf(show);
      total += bytes;
      if (show.find("name sluice_lb4_") != std::string::npos ||
          show.find("name sluice_ct4") != std::string::npos)
        lb += bytes;
      for (char& ch : show)
        if (ch == '\n' || ch == '\t') ch = ' ';
      std::printf("memlock %12llu | %s\n", static_cast<unsigned long long>(bytes), show.c_str());
    }
    std::printf("memlock_total=%llu memlock_lb_ct=%llu maps=%zu\n",
                static_cast<unsigned long long>(total), static_cast<unsigned long long>(lb),
                ids.size());
  }
  return 0;
}
