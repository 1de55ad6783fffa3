// What the lab apiserver's files share: reply helpers (metav1.Status bodies), the watch-event
// line, the discovery documents and the per-stream state of an open watch. Not for other users.
#ifndef SLUICE_AGENT_LAB_APISERVER_INTERNAL_H_
#define SLUICE_AGENT_LAB_APISERVER_INTERNAL_H_

#include <httplib.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/store/object_store.h"
#include "nlohmann/json.hpp"

namespace sluice::lab {

inline constexpr char kJson[] = "application/json";

inline void Reply(httplib::Response& res, int code, const nlohmann::json& body) {
  res.status = code;
  res.set_content(body.dump(), kJson);
}

inline void ReplyStatus(httplib::Response& res, int code, const std::string& reason,
                        const std::string& message) {
  Reply(res, code, StatusObject(code, reason, message));
}

// The store's error as kube-apiserver would answer it (404 NotFound, 409 Conflict, 410 Expired,
// 422 Invalid, ...), with details naming the resource.
void ReplyError(httplib::Response& res, const absl::Status& s, const ResourceType* type = nullptr,
                const std::string& name = "");

// One line of a watch stream: {"type":..., "object":...}\n.
inline std::string EventLine(const std::string& type, const nlohmann::json& object) {
  nlohmann::json e = {{"type", type}, {"object", object}};
  return e.dump() + "\n";
}

inline bool ParamTrue(const httplib::Request& req, const char* name) {
  std::string v = req.get_param_value(name);
  return v == "true" || v == "1";
}

// The labelSelector and fieldSelector of a list or watch request into `labels` / `fields`; on a
// bad selector answers 400 and returns false.
inline bool ParseSelectors(const httplib::Request& req, const ResourceType& type,
                           httplib::Response& res, LabelSelector* labels, FieldSelector* fields) {
  auto l = LabelSelector::Parse(req.get_param_value("labelSelector"));
  if (!l.ok()) {
    ReplyStatus(res, 400, "BadRequest", std::string(l.status().message()));
    return false;
  }
  auto f = FieldSelector::Parse(req.get_param_value("fieldSelector"), type.plural);
  if (!f.ok()) {
    ReplyStatus(res, 400, "BadRequest", std::string(f.status().message()));
    return false;
  }
  *labels = *l;
  *fields = *f;
  return true;
}

// /version, /api, /apis, /api/v1, /apis/GROUP and /apis/GROUP/v1; nullopt for any other path.
// `server_address` ("HOST:PORT") goes into /api's serverAddressByClientCIDRs.
std::optional<nlohmann::json> DiscoveryDocument(const std::string& path,
                                                const std::string& server_address);

struct ApiServer::ActiveWatch {
  std::unique_ptr<WatchStream> stream;
  uint64_t cut_generation;
  std::atomic<bool> shutdown{false};
  std::atomic<bool> frozen{false};        // FreezeWatches
  std::atomic<bool> bookmark_now{false};  // SendBookmarks
};

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_APISERVER_INTERNAL_H_
