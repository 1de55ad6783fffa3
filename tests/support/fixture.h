// A loaded datapath on a private bpffs for one test, and BPF_PROG_TEST_RUN on its programs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "support/packet.h"
#include "gtest/gtest.h"
#include "loader/datapath.h"

namespace sluice::testing {

struct RunResult {
  int verdict = -1;
  Bytes out;
};

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
  RunResult Run(int prog_fd, const Bytes& in, int ifindex = 1);
  uint64_t Drops(unsigned reason);

  std::unique_ptr<ScratchBpffs> bpffs_;
  std::unique_ptr<loader::Datapath> dp_;
};

// One backend of a service programmed by ProgramService.
struct LbBackendSpec {
  uint32_t id;
  std::string addr;
  uint16_t port;  // host order
  uint8_t proto;
};

// The sluice_lb4_svc key of a frontend's slot (0: the master entry).
sluice_lb4_key LbKey(const std::string& addr, uint16_t port, uint8_t proto, uint16_t slot);

// Writes a service through the production maps/ API in the agent's hitless order: backends, the
// reverse-NAT entry, slots 1..n, then the master. Slots beyond n are left to the caller.
[[nodiscard]] absl::Status ProgramService(loader::Datapath& dp, const std::string& addr,
                                          uint16_t port, uint8_t proto, uint32_t rev_nat_id,
                                          const std::vector<LbBackendSpec>& backends,
                                          uint16_t flags = 0, uint32_t affinity_timeout = 0);

// TC verdicts as the kernel's linux/pkt_cls.h numbers them.
inline constexpr int kTcOk = 0;
inline constexpr int kTcShot = 2;
inline constexpr int kTcRedirect = 7;

}  // namespace sluice::testing
