// Security identities: a label set (what NetworkPolicy can tell apart about a peer) -> a number
// the datapath keys policy on (maps/policy.h). Numbers are node-local: the overlay does not carry
// them, a receiver derives a packet's source identity from its own ipcache. A number stays the
// same while its label set is wanted, is not reused until the number space wraps, and survives an
// agent restart through a state file (<state_dir>/identities.json) written after each change.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "maps/policy.h"

namespace sluice::agent {

// Sorted, unique "source:key=value" strings. Sources:
//   k8s:<key>=<value>                                   a pod label
//   k8s:io.kubernetes.pod.namespace=<ns>                the pod's namespace
//   k8s:io.kubernetes.pod.namespace.labels.<key>=<v>    a label of the pod's namespace
//   reserved:<host|world|unmanaged|remote-node>         a reserved identity's base
//   cidr:<prefix>                                       an ipBlock prefix (cidr or except) of
//                                                       some policy that contains the address
//   port:<PROTO>/<name>=<number>                        a named container port of the pod that
//                                                       some egress rule names
using LabelSet = std::vector<std::string>;

inline constexpr std::string_view kPodLabelSource = "k8s:";
inline constexpr std::string_view kNamespaceNameLabel = "k8s:io.kubernetes.pod.namespace=";
inline constexpr std::string_view kNamespaceLabelSource = "k8s:io.kubernetes.pod.namespace.labels.";
inline constexpr std::string_view kReservedSource = "reserved:";
inline constexpr std::string_view kCidrSource = "cidr:";
inline constexpr std::string_view kNamedPortSource = "port:";

// The label set of a reserved identity (SLUICE_IDENTITY_HOST ... REMOTE_NODE), {} otherwise.
LabelSet ReservedLabels(uint32_t identity);
// "host", "world", "unmanaged", "remote-node"; "" for other numbers.
std::string_view ReservedName(uint32_t identity);

struct IdentityRecord {
  uint32_t id = 0;
  LabelSet labels;
  friend bool operator==(const IdentityRecord&, const IdentityRecord&) = default;
};

class IdentityAllocator {
 public:
  explicit IdentityAllocator(uint32_t min_id = SLUICE_IDENTITY_MIN_DYNAMIC,
                             uint32_t max_id = SLUICE_IDENTITY_MAX_DYNAMIC);

  // Takes the numbers of a previous run (before the first Assign). Rejects numbers outside the
  // dynamic range, a number or a label set given twice, and unsorted label sets.
  [[nodiscard]] absl::Status Restore(const std::vector<IdentityRecord>& records);

  // Makes `wanted` exactly the allocated label sets (level-triggered: call it with the complete
  // view, i.e. after the first full list of every watch, or restored numbers would be released).
  // Label sets already numbered keep their number; new ones get the next free numbers, in sorted
  // order; the others are released. Reserved label sets are never numbered dynamically.
  // ResourceExhausted when the range is full (the label sets that got no number are unknown to
  // Find; the translator then treats their addresses as unmanaged).
  [[nodiscard]] absl::Status Assign(const std::set<LabelSet>& wanted);
  // The same for label sets held elsewhere: `wanted` sorted by content and unique. One walk
  // over the numbered sets, nothing copied but the new ones (the per-batch path).
  [[nodiscard]] absl::Status Assign(const std::vector<const LabelSet*>& wanted);
  // Moves whenever a number is given or released (Restore, Assign): equal generations, equal
  // Records().
  uint64_t generation() const { return generation_; }

  // Reserved identities are always found.
  std::optional<uint32_t> Find(const LabelSet& labels) const;
  // nullptr for unknown numbers.
  const LabelSet* Labels(uint32_t id) const;
  // The dynamic identities, sorted by number.
  std::vector<IdentityRecord> Records() const;
  size_t size() const { return by_id_.size(); }

 private:
  std::optional<uint32_t> NextFree();

  uint32_t min_id_, max_id_;
  uint32_t next_;  // where the search for a free number starts
  std::map<uint32_t, LabelSet> by_id_;
  std::map<LabelSet, uint32_t> by_labels_;
  uint64_t generation_ = 0;
};

// The state file: {"identities":[{"id":256,"labels":["k8s:app=a", ...]}, ...]}.
std::string IdentitiesToJson(const std::vector<IdentityRecord>& records);
[[nodiscard]] absl::StatusOr<std::vector<IdentityRecord>> IdentitiesFromJson(std::string_view json);
inline constexpr char kIdentityStateFile[] = "identities.json";
// Atomically (re)writes <dir>/identities.json.
[[nodiscard]] absl::Status SaveIdentities(const std::string& dir,
                                          const std::vector<IdentityRecord>& records);
// An absent file is an empty list (first start).
[[nodiscard]] absl::StatusOr<std::vector<IdentityRecord>> LoadIdentities(const std::string& dir);

}  // namespace sluice::agent
