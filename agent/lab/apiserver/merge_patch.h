// Strategic merge patch (kubectl's default patch type) for the kinds the lab serves: list merge
// keys (containers/env/volumes by name, container ports by containerPort, Service ports by port,
// conditions by type, ...) and the $patch / $setElementOrder / $retainKeys /
// $deleteFromPrimitiveList directives.
#ifndef SLUICE_AGENT_LAB_APISERVER_MERGE_PATCH_H_
#define SLUICE_AGENT_LAB_APISERVER_MERGE_PATCH_H_

#include "nlohmann/json.hpp"

namespace sluice::lab {

nlohmann::json StrategicMergePatch(const nlohmann::json& original, const nlohmann::json& patch);

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_APISERVER_MERGE_PATCH_H_
