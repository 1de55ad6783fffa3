// A loaded datapath on a private bpffs for one test, and BPF_PROG_TEST_RUN on its programs.
#pragma once

#include <concepts>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "loader/datapath.h"
#include "support/packet.h"

namespace sluice::testing {

struct RunResult {
  int verdict = -1;
  Bytes out;
  uint32_t mark = 0;  // TC: the skb's mark after the run
};

// ---- Packet tables (Katran's fixture style) ----------------------------------------------------
// A case is a list of steps, each one packet through one program with what must come of it. Most
// cases are one step; a flow's first packet and its reply are two, the reply built from what the
// first step put out (the backend the program picked at random, the port it allocated).

// kXdpNet is an XDP program: its steps' verdicts are XDP's (kXdpPass, ...).
enum class Prog { kFromPod, kToPod, kFromNet, kToNet, kFromOverlay, kXdpNet };
const char* ProgName(Prog p);

// The decoded outputs of a case's steps so far, and their raw bytes.
struct Trail {
  std::vector<Decoded> out;
  std::vector<Bytes> raw;
  const Decoded& last() const { return out.back(); }
};

// A frame given outright, or made from the trail.
class Frame {
 public:
  Frame(const Packet& p) : bytes_(p.Build()) {}  // NOLINT: implicit by design
  Frame(Bytes b) : bytes_(std::move(b)) {}       // NOLINT
  template <typename F>
  requires std::invocable<const F&, const Trail&> Frame(F f) {  // NOLINT
    fn_ = [f = std::move(f)](const Trail& t) -> Bytes {
      auto made = f(t);
      if constexpr (std::same_as<decltype(made), Bytes>) {
        return made;
      } else {
        return made.Build();
      }
    };
  }
  Bytes Make(const Trail& t) const { return fn_ ? fn_(t) : bytes_; }

 private:
  Bytes bytes_;
  std::function<Bytes(const Trail&)> fn_;
};

struct Step {
  Prog prog = Prog::kFromPod;
  Frame in = Bytes{};
  int verdict = 0;
  // The output must equal one of these byte for byte (more than one where the program picks at
  // random). They are made from the trail *including this step's output*, for the one value the
  // program chooses itself (an allocated port), which `effects` then checks on its own.
  // Empty: the output is not compared (a drop), unless `unchanged`.
  std::vector<Frame> out;
  bool unchanged = false;  // the output is the input, byte for byte
  // The drop reason counted exactly once by this step; no other reason may move. None: no
  // counter moves at all.
  std::optional<unsigned> drop;
  // Map writes before the packet (beyond the fixture's set-up).
  std::function<void(loader::Datapath&)> setup;
  // Map side effects and other checks after the packet; the trail includes this step.
  std::function<void(loader::Datapath&, const Trail&)> effects;
  int ifindex = 1;  // lo: test_run receives on it
  // TC: the skb's mark going in, and the mark it must have after the program (maps/node.h).
  uint32_t mark_in = 0;
  std::optional<uint32_t> mark_out;
  // Instead of `prog`: a program of a test's companion BPF object, by name (the test fills
  // DatapathTest::companions_), e.g. one that runs a production path and reads metadata back.
  std::string companion;
};

struct PacketCase {
  std::string name;  // states the behaviour; a gtest name (letters and digits)
  std::vector<Step> steps;
};
void PrintTo(const PacketCase& c, std::ostream* os);
std::string CaseName(const ::testing::TestParamInfo<PacketCase>& info);

// A bpffs mounted on a fresh directory, unmounted (pins and all) on destruction.
class ScratchBpffs {
 public:
  ScratchBpffs();
  ~ScratchBpffs();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class DatapathTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Runs `prog_fd` once on `in` as if received on `ifindex` (1 = lo; test_run needs a real
  // device for any other index).
  RunResult Run(int prog_fd, const Bytes& in, int ifindex = 1, uint32_t mark = 0);
  // The same for an XDP program (the packet arrives on `ifindex`, rx queue 0).
  RunResult RunXdp(int prog_fd, const Bytes& in, int ifindex = 1);
  // Packets dropped under `reason`, in both directions / in direction `dir` (sluice_drop_dir).
  uint64_t Drops(unsigned reason);
  uint64_t Drops(unsigned reason, unsigned dir);
  // Packets and bytes forwarded in direction `dir` (sluice_fwd_dir), summed over CPUs.
  sluice_fwd_count Forwarded(unsigned dir);
  // Packets counted per drop reason (every reason, zeros included).
  std::map<unsigned, uint64_t> DropCounts();
  // Runs the steps of a table case in order, each checked as Step describes; a failure prints the
  // input, the expected and the actual packet layer by layer, and the fields that differ.
  void RunCase(const PacketCase& c);

  std::unique_ptr<ScratchBpffs> bpffs_;
  std::unique_ptr<loader::Datapath> dp_;
  std::map<std::string, int> companions_;  // Step::companion -> program fd
};

// The one way tests and benchmarks put a local endpoint into sluice_ep4 (what the agent's ADD
// writes): pod address (network order) -> host veth ifindex, pod MAC, host MAC, endpoint id,
// enum sluice_endpoint_flags.
[[nodiscard]] absl::Status AddEndpoint(loader::Datapath& dp, uint32_t addr_be, int ifindex,
                                       const Mac& mac, const Mac& host_mac, uint32_t endpoint_id,
                                       uint32_t flags = 0);

// One backend of a service programmed by ProgramService.
struct LbBackendSpec {
  uint32_t id;
  std::string addr;
  uint16_t port;  // host order
  uint8_t proto;
};

// The sluice_lb4_svc key of a frontend's slot (0: the master entry).
sluice_lb4_key LbKey(const std::string& addr, uint16_t port, uint8_t proto, uint16_t slot);

// A conntrack key (sluice_ct4 / sluice_ct4_any): ports in host order, dir an enum sluice_ct_dir.
sluice_ct4_key CtKey(const std::string& saddr, const std::string& daddr, uint16_t sport,
                     uint16_t dport, uint8_t proto, uint8_t dir);

// Writes a service through the production maps/ API in the agent's hitless order: backends, the
// reverse-NAT entry, slots 1..n, then the master. Slots beyond n are left to the caller.
// scope: enum sluice_lb_scope of the frontend's keys.
[[nodiscard]] absl::Status ProgramService(loader::Datapath& dp, const std::string& addr,
                                          uint16_t port, uint8_t proto, uint32_t rev_nat_id,
                                          const std::vector<LbBackendSpec>& backends,
                                          uint16_t flags = 0, uint32_t affinity_timeout = 0,
                                          uint8_t scope = SLUICE_LB_SCOPE_EXTERNAL);

// TC verdicts as the kernel's linux/pkt_cls.h numbers them.
inline constexpr int kTcOk = 0;
inline constexpr int kTcShot = 2;
inline constexpr int kTcRedirect = 7;
// XDP verdicts (linux/bpf.h's enum xdp_action).
inline constexpr int kXdpDrop = 1;
inline constexpr int kXdpPass = 2;
inline constexpr int kXdpTx = 3;
inline constexpr int kXdpRedirect = 4;

}  // namespace sluice::testing
