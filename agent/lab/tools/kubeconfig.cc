#include "agent/lab/tools/kubeconfig.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
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
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f)
      return absl::InternalError(absl::StrCat("write kubeconfig ", tmp, ": ", strerror(errno)));
    f << RenderKubeconfig(params);
    if (!f.flush()) return absl::InternalError(absl::StrCat("write kubeconfig ", tmp));
  }
  if (chmod(tmp.c_str(), 0600) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("install kubeconfig ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace sluice::lab
