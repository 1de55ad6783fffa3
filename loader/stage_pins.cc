#include "loader/stage_pins.h"

#include <bpf/bpf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "loader/skeleton.h"

namespace sluice::loader {
namespace {

// The ids of the program arrays the program `prog_fd` calls.
absl::Status AddCalledArrays(int prog_fd, std::set<uint32_t>& ids) {
  uint32_t maps[64];
  struct bpf_prog_info info = {};
  info.nr_map_ids = sizeof(maps) / sizeof(maps[0]);
  info.map_ids = reinterpret_cast<uint64_t>(maps);
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(prog_fd, &info, &len) != 0) {
    return ErrnoStatus(errno, "read an entry program's maps");
  }
  for (uint32_t i = 0; i < std::min<uint32_t>(info.nr_map_ids, sizeof(maps) / sizeof(maps[0]));
       ++i) {
    int fd = bpf_map_get_fd_by_id(maps[i]);
    if (fd < 0) continue;
    struct bpf_map_info m = {};
    uint32_t mlen = sizeof(m);
    if (bpf_obj_get_info_by_fd(fd, &m, &mlen) == 0 && m.type == BPF_MAP_TYPE_PROG_ARRAY)
      ids.insert(m.id);
    close(fd);
  }
  return absl::OkStatus();
}

// How many arrays pinned in `dir` are not among `own`.
int OthersPinned(const std::string& dir, const std::set<uint32_t>& own) {
  int others = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    int fd = bpf_obj_get(e.path().c_str());
    if (fd < 0) continue;  // released since
    struct bpf_map_info m = {};
    uint32_t len = sizeof(m);
    if (bpf_obj_get_info_by_fd(fd, &m, &len) == 0 && own.count(m.id) == 0) ++others;
    close(fd);
  }
  return others;
}

}  // namespace

absl::StatusOr<int> AwaitReplacedStagesReleased(Datapath& dp, absl::Duration timeout,
                                                const Clock* clock) {
  std::set<uint32_t> own;
  for (int fd : {dp.from_pod_fd(), dp.from_net_fd(), dp.from_overlay_fd()}) {
    if (auto st = AddCalledArrays(fd, own); !st.ok()) return st;
  }
  const std::string dir = absl::StrCat(dp.bpffs_root(), "/", kStagesDir);
  const absl::Time deadline = clock->Now() + timeout;
  absl::Notification never;  // the pauses end on time only
  absl::Duration wait = absl::Milliseconds(1);
  while (true) {
    auto released = dp.ReleaseReplacedStages();
    if (!released.ok()) return released.status();
    const int others = OthersPinned(dir, own);
    if (others == 0 || clock->Now() >= deadline) return others;
    // Freed an RCU grace period (and a work item) after the replacing attach: milliseconds.
    (void)clock->SleepFor(wait, never);
    wait = std::min(wait * 2, absl::Milliseconds(50));
  }
}

}  // namespace sluice::loader
