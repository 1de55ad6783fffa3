// The verifier budget: every program the agent can load, in every build and load-time
// configuration it loads, verifies at most kBudget instructions (the kernel's own count,
// bpf_prog_info.verified_insns), a quarter of the kernel's limit, so that the next feature has room
// (docs/architecture.md, "Stages"). The table of every program's count is printed on every run.
//
// What changes what the verifier sees is a build or a load-time constant (`const volatile`,
// STYLE.md): the TC objects' two builds (bpf_cast_to_kern_ctx, and SLUICE_NO_KERN_CTX for older
// kernels) and enable_ipv6 (the IPv6 stage's slot). Tunnel or native routing, policy on or off and
// the flow monitor on or off are map contents the programs read per packet (sluice_node,
// sluice_policy_ep, sluice_monitor): one program serves all of them, so loading it once covers
// them. XDP is sluice_xdp, the socket calls sluice_sock_lb.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "loader/datapath.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

constexpr uint32_t kBudget = 250000;

struct Count {
  std::string object;  // with its build and configuration
  std::string program;
  uint32_t insns;
};

template <typename Skel>
void LoadAndCount(const std::string& pin_root, const std::string& label,
                  typename loader::Skeleton<Skel>::Configure configure,
                  std::vector<Count>* counts) {
  auto skel = loader::Skeleton<Skel>::OpenAndLoad(pin_root, std::move(configure));
  ASSERT_TRUE(skel.ok()) << label << ": " << skel.status();
  struct bpf_program* prog;
  bpf_object__for_each_program(prog, (**skel)->obj) {
    struct bpf_prog_info info = {};
    uint32_t len = sizeof(info);
    ASSERT_EQ(bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &len), 0)
        << label << " " << bpf_program__name(prog);
    counts->push_back({label, bpf_program__name(prog), info.verified_insns});
  }
}

TEST(VerifierBudget, EveryProgramOfEveryConfigurationVerifiesAtMostAQuarterOfTheLimit) {
  ScratchBpffs bpffs;
  std::vector<Count> counts;
  auto ipv6 = [](bool on) {
    return [on](sluice_pod_egress* s) {
      s->rodata->enable_ipv6 = on ? 1 : 0;
      return absl::OkStatus();
    };
  };
  for (bool kern_ctx : {true, false}) {
    loader::ForceNoKernCtxForTesting(!kern_ctx);
    const std::string build = kern_ctx ? "" : " (compat)";
    for (bool on : {false, true}) {
      LoadAndCount<sluice_pod_egress>(
          bpffs.path(), "sluice_pod_egress" + build + (on ? " ipv6" : ""), ipv6(on), &counts);
    }
    LoadAndCount<sluice_netdev>(bpffs.path(), "sluice_netdev" + build, nullptr, &counts);
    LoadAndCount<sluice_overlay>(bpffs.path(), "sluice_overlay" + build, nullptr, &counts);
  }
  loader::ForceNoKernCtxForTesting(false);
  LoadAndCount<sluice_xdp>(bpffs.path(), "sluice_xdp", nullptr, &counts);
  LoadAndCount<sluice_sock_lb>(bpffs.path(), "sluice_sock_lb", nullptr, &counts);

  printf("%-34s %-22s %14s %8s\n", "object", "program", "verified_insns", "budget");
  for (const Count& c : counts) {
    printf("%-34s %-22s %14u %7.0f%%\n", c.object.c_str(), c.program.c_str(), c.insns,
           100.0 * c.insns / kBudget);
  }
  for (const Count& c : counts) {
    EXPECT_GT(c.insns, 0u) << c.object << " " << c.program << ": no count from the kernel";
    EXPECT_LE(c.insns, kBudget) << c.object << " " << c.program << " is over the budget";
  }
  // Every program of every object was seen: the entry programs and their stages.
  EXPECT_EQ(counts.size(), 2u * (2 * 3 + 4 + 3) + 1 + 4);
}

}  // namespace
}  // namespace sluice::testing
