// Small, careful file-system operations shared by the agent's persisted state (IPAM, endpoint
// records, CNI install, the API socket's directory). Every error names errno and what was done:
// "create /var/lib/sluice/ipam/x.tmp: ENOSPC (No space left on device)".
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/base/errno.h"

namespace sluice::agent {


// mkdir -p with mode 0700 for what it creates; an existing non-directory is an error.
[[nodiscard]] absl::Status MakeDirs(const std::string& path);

// fsync of a directory, so a rename or create in it is durable.
[[nodiscard]] absl::Status SyncDir(const std::string& dir);

// Writes all of `data` to `fd`, through short writes and EINTR; an error names errno and
// `what`. A descriptor that refuses more (O_NONBLOCK and full) fails with EAGAIN: sockets and
// pipes that may fill wait with a deadline instead (agent/base/deadline.h).
[[nodiscard]] absl::Status WriteAll(int fd, absl::string_view data, absl::string_view what);

// Writes all of `data` to `fd` and fsyncs it.
[[nodiscard]] absl::Status WriteAllAndSync(int fd, absl::string_view data,
                                           absl::string_view what);

// How long a WriteFileAtomically must last.
enum class Durability {
  kPowerLoss,     // fsync of the file and of the directory: survives a node crash
  kProcessCrash,  // no fsync: the page cache keeps the rename when the process dies, a node
                  // crash may lose it (for state that describes only what a reboot clears, such
                  // as the pinned BPF maps)
};

// Replaces dir/name so that readers see the old or the new content, never a mix: a temporary
// "<name>.tmp" in the same directory, (fsync,) rename(, fsync of the directory).
[[nodiscard]] absl::Status WriteFileAtomically(const std::string& dir, const std::string& name,
                                               absl::string_view data, mode_t mode = 0600,
                                               Durability durability = Durability::kPowerLoss);

// Whether state can be written in `dir` now (readiness): writes, as WriteFileAtomically without
// fsync, and removes "<dir>/.write-probe" of 1 KiB (an endpoint record's order of size). A full
// file system fails it with ENOSPC, a read-only one with EROFS.
[[nodiscard]] absl::Status ProbeWritable(const std::string& dir);

// Reads a file of at most 1 MiB. Never waits for a writer: a FIFO put in a file's place reads
// as empty or fails (O_NONBLOCK).
[[nodiscard]] absl::StatusOr<std::string> ReadSmallFile(const std::string& path);

// Suffix of WriteFileAtomically's temporary files (left behind only by a crash).
inline constexpr char kTmpSuffix[] = ".tmp";

}  // namespace sluice::agent
