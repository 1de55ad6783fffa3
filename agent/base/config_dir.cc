#include "agent/base/config_dir.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "agent/base/files.h"

namespace sluice::agent {

absl::flat_hash_set<std::string> FlagsOnCommandLine(int argc, char** argv) {
  absl::flat_hash_set<std::string> names;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    std::string name(arg.substr(0, arg.find('=')));
    // "--nofoo" is absl's spelling of "--foo=false" for a bool flag named foo.
    if (absl::StartsWith(name, "no") && absl::FindCommandLineFlag(name) == nullptr &&
        absl::FindCommandLineFlag(name.substr(2)) != nullptr) {
      name = name.substr(2);
    }
    names.insert(std::move(name));
  }
  return names;
}

absl::StatusOr<std::vector<std::string>> ApplyConfigDir(
    const std::string& dir, const absl::flat_hash_set<std::string>& on_command_line) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("config dir ", dir, ": ", ec.message()));
  std::vector<std::pair<std::string, std::string>> entries;  // name, path
  for (const auto& entry : it) {
    std::string name = entry.path().filename();
    if (absl::StartsWith(name, ".")) continue;  // ..data, ..<timestamp>, editors' dot-files
    entries.emplace_back(name, entry.path());
  }
  std::sort(entries.begin(), entries.end());

  std::vector<std::string> applied;
  for (const auto& [name, path] : entries) {
    if (!std::filesystem::is_regular_file(path, ec)) {  // follows the kubelet's symlinks
      return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": not a file"));
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    // absl's own flags (flagfile, fromenv, help...) are not configuration.
    if (flag == nullptr || name == "config_dir" || absl::StrContains(flag->Filename(), "absl/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file ", path, ": no agent flag --", name));
    }
    auto content = ReadSmallFile(path);
    if (!content.ok()) {
      return absl::Status(content.status().code(),
                          absl::StrCat("config file ", path, ": ", content.status().message()));
    }
    std::string value(absl::StripTrailingAsciiWhitespace(*content));
    // A file overridden on the command line is still checked, then the flag's value restored.
    const bool overridden = on_command_line.contains(name);
    const std::string command_line_value = flag->CurrentValue();
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": bad value '", value,
                                                     "' for --", name, ": ", error));
    }
    if (!overridden) {
      applied.push_back(name);
    } else if (!flag->ParseFrom(command_line_value, &error)) {
      return absl::InternalError(absl::StrCat("restore --", name, ": ", error));
    }
  }
  return applied;
}

}  // namespace sluice::agent
