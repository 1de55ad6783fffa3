// Server-side printing: the meta.k8s.io/v1 Table kube-apiserver answers when a client asks with
// `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (what `kubectl get` sends), with the
// columns kube-apiserver's printers give each built-in resource (pods, services, nodes,
// namespaces, endpointslices, networkpolicies, leases, events; NAME and AGE for anything else).
#ifndef SLUICE_AGENT_LAB_APISERVER_TABLES_H_
#define SLUICE_AGENT_LAB_APISERVER_TABLES_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "agent/lab/store/object_store.h"
#include "nlohmann/json.hpp"

namespace sluice::lab {

// What each row carries besides its cells (the `includeObject` query parameter).
enum class TableRowObject { kNone, kPartialObjectMetadata, kObject };

struct TableRequest {
  std::string api_version;  // "meta.k8s.io/v1" (or v1beta1)
  TableRowObject row_object = TableRowObject::kPartialObjectMetadata;
};

// The Table the Accept header asks for (the first media type that is a Table kube-apiserver
// serves), or nullopt for plain objects. `include_object` is the query parameter ("" = default).
std::optional<TableRequest> TableRequested(std::string_view accept,
                                           std::string_view include_object);

// kube-apiserver's age format (HumanDuration): "45s", "5m30s", "12m", "3h20m", "2d4h", ...
std::string HumanDuration(absl::Duration d);

// The columns of `type`'s table.
nlohmann::json TableColumns(const ResourceType& type);
// One row's cells, in TableColumns order; `now` is what ages count from.
nlohmann::json TableCells(const ResourceType& type, const nlohmann::json& object, absl::Time now);

// A whole Table: list metadata (resourceVersion, continue) and one row per object.
nlohmann::json TableOf(const ResourceType& type, const std::vector<ObjectPtr>& objects,
                       const TableRequest& request, absl::Time now,
                       const std::string& resource_version, const std::string& continue_token = "");

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_APISERVER_TABLES_H_
