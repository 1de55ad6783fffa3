// The project's one errno -> absl::Status conversion: absl's errno mapping (ENOENT -> NotFound,
// EEXIST -> AlreadyExists, EAGAIN -> Unavailable, ...), plus E2BIG -> ResourceExhausted, which
// is how the kernel says a BPF map is full. The message names what was being done and the
// errno by name and text: "attach tc ingress on slc1a2b: EEXIST (File exists)".
// Header-only, so maps/, loader/ and cni/ use it without linking the agent.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace sluice {

inline std::string ErrnoText(int err) {
  const char* name = strerrorname_np(err);
  const char* text = strerrordesc_np(err);
  return absl::StrCat(name != nullptr ? name : absl::StrCat("errno ", err), " (",
                      text != nullptr ? text : "unknown error", ")");
}

inline absl::StatusCode ErrnoCode(int err) {
  if (err == E2BIG) return absl::StatusCode::kResourceExhausted;
  return absl::ErrnoToStatusCode(err);
}

[[nodiscard]] inline absl::Status ErrnoStatus(int err, absl::string_view what) {
  return absl::Status(ErrnoCode(err), absl::StrCat(what, ": ", ErrnoText(err)));
}

}  // namespace sluice
