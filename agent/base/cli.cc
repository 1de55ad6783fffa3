#include "agent/base/cli.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "agent/base/version.h"
#include "spdlog/spdlog.h"

namespace sluice::cli {
namespace {

bool IsHelp(absl::string_view a) {
  return a == "--help" || a == "-help" || a == "-h" || a == "--helpfull" || a == "-helpfull" ||
         a == "--helpshort" || a == "-helpshort";
}

bool IsVersion(absl::string_view a) { return a == "--version" || a == "-version"; }

std::vector<const absl::CommandLineFlag*> OwnFlags() {
  std::vector<const absl::CommandLineFlag*> own;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    // abseil's own flags (--flagfile, --fromenv, --help*, ...) are defined under absl/.
    if (flag->Filename().find("absl/") != std::string::npos) continue;
    own.push_back(flag);
  }
  std::sort(own.begin(), own.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  return own;
}

}  // namespace

std::string VersionLine(absl::string_view program) {
  return absl::StrCat(program, " ", SLUICE_VERSION_STRING);
}

std::vector<std::pair<std::string, std::string>> OwnFlagValues() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const absl::CommandLineFlag* f : OwnFlags()) out.emplace_back(f->Name(), f->CurrentValue());
  return out;
}

std::string OwnFlagsHelp() {
  std::vector<const absl::CommandLineFlag*> own = OwnFlags();
  std::string out;
  for (const absl::CommandLineFlag* f : own) {
    absl::StrAppend(&out, "  --", f->Name(), "=", f->DefaultValue(), "\n      ",
                    absl::StrReplaceAll(f->Help(), {{"\n", "\n      "}}), "\n");
  }
  return out;
}

std::vector<char*> ParseCommandLine(int argc, char** argv, absl::string_view program,
                                    absl::string_view usage) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  std::string version = VersionLine(program);
  config.version_string = [version] { return version + "\n"; };
  // abseil's --help lists only flags defined in a file named like the binary; ours are not.
  config.contains_help_flags = [](absl::string_view file) {
    return file.find("absl/") == absl::string_view::npos;
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (a == "--") break;
    if (IsHelp(a)) {
      std::string flags = OwnFlagsHelp();
      std::printf("%s\n\n%s\nflags:\n%s", std::string(usage).c_str(), version.c_str(),
                  flags.empty() ? "  (none)\n" : flags.c_str());
      std::fflush(stdout);
      std::exit(0);
    }
    if (IsVersion(a)) {
      std::printf("%s\n", version.c_str());
      std::fflush(stdout);
      std::exit(0);
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

void ParseFlagsOnly(int argc, char** argv, absl::string_view program, absl::string_view usage) {
  std::vector<char*> args = ParseCommandLine(argc, argv, program, usage);
  if (args.size() > 1) std::exit(RefuseArgument(program, args[1], usage));
}

int RefuseArgument(absl::string_view program, absl::string_view word, absl::string_view usage) {
  std::fprintf(stderr, "%s: unexpected argument '%s'\nusage: %s\n", std::string(program).c_str(),
               std::string(word).c_str(), std::string(usage).c_str());
  return 2;
}

std::string ExplainPermission(const absl::Status& status, absl::string_view needed) {
  std::string out(status.message());
  if (status.code() == absl::StatusCode::kPermissionDenied) {
    absl::StrAppend(&out, "; ", needed);
  }
  return out;
}

absl::Status SetLogLevel(absl::string_view level) {
  static constexpr absl::string_view kLevels[] = {"trace", "debug",    "info", "warn",
                                                  "error", "critical", "off"};
  for (size_t i = 0; i < std::size(kLevels); ++i) {
    if (level == kLevels[i]) {
      spdlog::set_level(static_cast<spdlog::level::level_enum>(i));
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--log_level=", level, ": want one of trace, debug, info, warn, error, critical, off"));
}

}  // namespace sluice::cli
