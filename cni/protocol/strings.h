// Debian bookworm's abseil is built with its own absl::string_view and absl::optional (not the
// std types), so absl's string functions do not accept std::string_view. These bridge the gap
// for code that keeps std::string_view in its interfaces.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace sluice::cni {

[[nodiscard]] inline absl::string_view AsAbsl(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}

// absl::StrCat that also takes std::string_view (and anything convertible to it).
template <typename... Args>
[[nodiscard]] std::string StrCat(const Args&... args) {
  auto bridge = [](const auto& arg) -> decltype(auto) {
    using T = std::decay_t<decltype(arg)>;
    if constexpr (!std::is_arithmetic_v<T> && std::is_convertible_v<const T&, std::string_view>) {
      return AsAbsl(std::string_view(arg));
    } else {
      return (arg);
    }
  };
  return absl::StrCat(bridge(args)...);
}

}  // namespace sluice::cni
