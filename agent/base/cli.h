// What every Sluice binary does with its command line: `--help` (also -h, --helpfull) prints the
// usage and the binary's own flags (not abseil's) to stdout and exits 0, `--version` prints the
// build's version and exits 0, everything else goes to absl::ParseCommandLine; and the one
// reading of `--log_level`, where an unknown level is an error instead of silence.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sluice::cli {

// "sluice-agent 0.1.0 (git v0.1.0-12-gc26e9d1)"
std::string VersionLine(absl::string_view program);

// Every flag defined outside abseil, sorted, one "  --name=default" line and its help below.
std::string OwnFlagsHelp();

// The same flags' current values, sorted by name: what `sluicectl config` shows.
std::vector<std::pair<std::string, std::string>> OwnFlagValues();

// Handles --help and --version as above (exit 0), then parses the rest with abseil (an unknown
// flag: exit 1 with abseil's message). Returns the positional arguments, argv[0] first.
std::vector<char*> ParseCommandLine(int argc, char** argv, absl::string_view program,
                                    absl::string_view usage);

// The same for a daemon, which takes flags only: a positional argument (`sluice-agent help`,
// `sluice-operator version`) is refused with the usage on stderr and exit 2, before anything
// starts.
void ParseFlagsOnly(int argc, char** argv, absl::string_view program, absl::string_view usage);

// Prints "PROGRAM: unexpected argument 'WORD'" and the usage to stderr; returns 2, the exit code
// of a usage error.
int RefuseArgument(absl::string_view program, absl::string_view word, absl::string_view usage);

// What a refusal by the kernel or the filesystem (EPERM, EACCES: PermissionDenied) means for
// whoever ran the binary: `status`'s message followed by what is needed, e.g. "...: EACCES
// (Permission denied); sluicectl reads the pinned maps and the agent's state: run it as root
// (or with CAP_BPF and read access to the files)". Other statuses: their message unchanged.
std::string ExplainPermission(const absl::Status& status, absl::string_view needed);

// trace, debug, info, warn, error, critical, off. Anything else: InvalidArgument naming
// `--log_level` and the accepted levels, and the level is left as it was.
[[nodiscard]] absl::Status SetLogLevel(absl::string_view level);

}  // namespace sluice::cli
