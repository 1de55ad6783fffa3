// Agent configuration from a directory, in the layout of a Kubernetes ConfigMap mounted as a
// volume: one file per key, the key is a flag's name, the file's content is its value. A flag
// given on the command line wins over its file. The kubelet's mount is a symlink farm
// (key -> ..data/key, ..data -> ..<timestamp>/): names starting with '.' are skipped and
// symlinks followed.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::agent {

// The names of the flags that argv sets ("--name=v", "--name v", "-name", "--noname" for bools),
// up to a "--" terminator. argv[0] is the program.
absl::flat_hash_set<std::string> FlagsOnCommandLine(int argc, char** argv);

// Sets every flag named by a file in `dir` to the file's content (trailing whitespace and
// newlines trimmed), except those in `on_command_line`. An unknown key, a key naming one of
// absl's own flags (flagfile, help, ...) or `config_dir` itself, a subdirectory, or a value the
// flag does not accept (even one the command line overrides) is an error naming the file: the
// agent refuses to start. Returns the names applied, sorted.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ApplyConfigDir(
    const std::string& dir, const absl::flat_hash_set<std::string>& on_command_line);

}  // namespace sluice::agent
