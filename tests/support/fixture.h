// A loaded datapath on a private bpffs for one test, and BPF_PROG_TEST_RUN on its programs.
#pragma once

#include <memory>
#include <string>

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

// TC verdicts as the kernel's linux/pkt_cls.h numbers them.
inline constexpr int kTcOk = 0;
inline constexpr int kTcShot = 2;
inline constexpr int kTcRedirect = 7;

}  // namespace sluice::testing
