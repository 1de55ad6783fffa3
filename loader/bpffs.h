// The bpffs root Sluice pins its maps under.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace sluice::loader {

// Makes `root` a directory on a bpf filesystem: creates it (and parents) when missing and mounts
// a bpffs on it when it is not on one already. Idempotent.
[[nodiscard]] absl::Status EnsureBpffs(const std::string& root);

// True when `path` lies on a bpf filesystem.
bool IsOnBpffs(const std::string& path);

}  // namespace sluice::loader
