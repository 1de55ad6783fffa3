// Fields of Kubernetes objects held as JSON, read by a path of keys: a missing step, or one that
// is not an object, reads as absent instead of throwing.
#pragma once

#include <initializer_list>
#include <string>

#include "nlohmann/json.hpp"

namespace sluice::lab {

// The value at path, or a null value.
const nlohmann::json& JsonAt(const nlohmann::json& obj, std::initializer_list<const char*> path);

// The string at path, or def when it is absent or not a string.
std::string JsonStr(const nlohmann::json& obj, std::initializer_list<const char*> path,
                    const std::string& def = "");

}  // namespace sluice::lab
