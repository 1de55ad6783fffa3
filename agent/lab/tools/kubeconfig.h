// A kubeconfig for the lab cluster: server URL, the CA inline, a bearer token.
#ifndef SLUICE_AGENT_LAB_TOOLS_KUBECONFIG_H_
#define SLUICE_AGENT_LAB_TOOLS_KUBECONFIG_H_

#include <string>

#include "absl/status/status.h"

namespace sluice::lab {

struct KubeconfigParams {
  std::string server;  // https://127.0.0.1:6443
  std::string ca_cert_pem;
  std::string token;
  std::string cluster_name = "sluice-lab";
  std::string user_name = "sluice-lab-admin";
  std::string context_name = "sluice-lab";
  std::string default_namespace;  // empty: not set
};

std::string RenderKubeconfig(const KubeconfigParams& params);
// Writes atomically (temp file + rename) with mode 0600.
absl::Status WriteKubeconfig(const std::string& path, const KubeconfigParams& params);

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_TOOLS_KUBECONFIG_H_
