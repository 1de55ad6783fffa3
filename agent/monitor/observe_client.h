// The client side of the observe socket (observe_server.h), for sluicectl and tests: sends one
// request and hands each reply line to a callback until the agent ends the stream or the
// callback returns false.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "nlohmann/json_fwd.hpp"

namespace sluice::monitor {

// `on_line` gets every parsed reply line ({"status"|"flow"|"lost": ...}); an {"error": ...} line
// ends the call with that error.
[[nodiscard]] absl::Status Observe(const std::string& socket_path, const nlohmann::json& request,
                                   const std::function<bool(const nlohmann::json&)>& on_line);

// The same through an agent's relay (observe_server.h): TCP to HOST:PORT, the request carrying
// `token`.
[[nodiscard]] absl::Status ObserveRelay(const std::string& address, const std::string& token,
                                        nlohmann::json request,
                                        const std::function<bool(const nlohmann::json&)>& on_line);

}  // namespace sluice::monitor
