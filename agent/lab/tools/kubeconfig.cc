#include "agent/lab/tools/kubeconfig.h"

#include <filesystem>

#include "absl/strings/escaping.h"
#include "agent/base/files.h"
#include "yaml-cpp/yaml.h"

namespace sluice::lab {

std::string RenderKubeconfig(const KubeconfigParams& p) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "apiVersion" << YAML::Value << "v1";
  out << YAML::Key << "kind" << YAML::Value << "Config";
  out << YAML::Key << "clusters" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << p.cluster_name;
  out << YAML::Key << "cluster" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "server" << YAML::Value << p.server;
  out << YAML::Key << "certificate-authority-data" << YAML::Value
      << absl::Base64Escape(p.ca_cert_pem);
  out << YAML::EndMap << YAML::EndMap << YAML::EndSeq;
  out << YAML::Key << "users" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << p.user_name;
  out << YAML::Key << "user" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "token" << YAML::Value << p.token;
  out << YAML::EndMap << YAML::EndMap << YAML::EndSeq;
  out << YAML::Key << "contexts" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << p.context_name;
  out << YAML::Key << "context" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "cluster" << YAML::Value << p.cluster_name;
  out << YAML::Key << "user" << YAML::Value << p.user_name;
  if (!p.default_namespace.empty()) {
    out << YAML::Key << "namespace" << YAML::Value << p.default_namespace;
  }
  out << YAML::EndMap << YAML::EndMap << YAML::EndSeq;
  out << YAML::Key << "current-context" << YAML::Value << p.context_name;
  out << YAML::Key << "preferences" << YAML::Value << YAML::BeginMap << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

absl::Status WriteKubeconfig(const std::string& path, const KubeconfigParams& params) {
  const std::filesystem::path p(path);
  // An apiserver writes its kubeconfig each time it starts, with a new CA: no fsync.
  return agent::WriteFileAtomically(p.has_parent_path() ? p.parent_path().string() : ".",
                                    p.filename().string(), RenderKubeconfig(params), 0600,
                                    agent::Durability::kProcessCrash);
}

}  // namespace sluice::lab
