#include "agent/lab/store/json_path.h"

namespace sluice::lab {

const nlohmann::json& JsonAt(const nlohmann::json& obj, std::initializer_list<const char*> path) {
  static const nlohmann::json kNull;
  const nlohmann::json* cur = &obj;
  for (const char* p : path) {
    if (!cur->is_object()) return kNull;
    auto it = cur->find(p);
    if (it == cur->end()) return kNull;
    cur = &*it;
  }
  return *cur;
}

std::string JsonStr(const nlohmann::json& obj, std::initializer_list<const char*> path,
                    const std::string& def) {
  const nlohmann::json& v = JsonAt(obj, path);
  return v.is_string() ? v.get<std::string>() : def;
}

}  // namespace sluice::lab
