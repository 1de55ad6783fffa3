// The Service names sluicectl shows while the agent is down: <state_dir>/services.json, written
// by ServiceSync after each batch that changed a Service's names or frontends, atomically
// (a reader sees the old table or the new one). It holds, per Service, what names its frontends
// in sluice_lb4_svc: namespace, name, cluster and external IPs, and per port its name, protocol,
// port and nodePort, in the field names of the agent's /v1/services, so sluicectl reads either
// with one parser. A file rather than a pinned map: the names are variable-length strings no
// program reads, and a restarted agent rewrites the file after its first full sync, while until
// then the file still describes the maps the previous run left (the agent prunes nothing
// before that sync either).
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "agent/k8s/model.h"

namespace sluice::agent {

inline constexpr char kServiceNamesFile[] = "services.json";
// The frontends that do not fit in the Service maps (ServiceSync, reconciler.h): {"total": N,
// "frontends": [{"service", "frontend", "protocol", "scope", "reason", "map", "backends",
// "backendsProgrammed" (truncated ones)}]} in the programming order, at most 10000 listed.
inline constexpr char kServiceUnprogrammedFile[] = "services-unprogrammed.json";

class ServiceNameFile {
 public:
  // `dir` "" keeps the table in memory only (tests, the benchmarks).
  explicit ServiceNameFile(std::string dir) : dir_(std::move(dir)) {}

  // The Service `key` ("namespace/name") as the store has it now, or gone (nullptr).
  void Set(const std::string& key, const k8s::Service* service);
  // Writes the table when it changed since the last write (or the last write failed).
  [[nodiscard]] absl::Status Flush();
  // The table as written: a JSON array sorted by namespace/name.
  std::string Json() const;
  uint64_t writes() const { return writes_; }

 private:
  const std::string dir_;
  std::map<std::string, std::string> entries_;  // key -> that Service's JSON object
  bool dirty_ = false;
  uint64_t writes_ = 0;
};

}  // namespace sluice::agent
