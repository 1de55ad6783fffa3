// Kubernetes label selectors (the string syntax of `?labelSelector=`), field selectors and the
// map form used by Service.spec.selector.
#ifndef SLUICE_AGENT_LAB_STORE_SELECTORS_H_
#define SLUICE_AGENT_LAB_STORE_SELECTORS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace sluice::lab {

// `a=b,c!=d,e in (f,g),h notin (i),j,!k` as kube-apiserver parses it.
class LabelSelector {
 public:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };

  static absl::StatusOr<LabelSelector> Parse(std::string_view text);
  // `labels` is metadata.labels (object or null).
  bool Matches(const nlohmann::json& labels) const;
  bool empty() const { return requirements_.empty(); }
  const std::vector<Requirement>& requirements() const { return requirements_; }

 private:
  std::vector<Requirement> requirements_;
};

// `metadata.name=x,spec.nodeName!=y`. Supported fields: metadata.name, metadata.namespace for
// every resource; spec.nodeName, status.phase, status.podIP for pods; spec.type for services.
class FieldSelector {
 public:
  struct Requirement {
    std::string field;
    bool equals;
    std::string value;
  };
  static absl::StatusOr<FieldSelector> Parse(std::string_view text, std::string_view plural);
  bool Matches(const nlohmann::json& object) const;
  bool empty() const { return requirements_.empty(); }

 private:
  std::vector<Requirement> requirements_;
};

// Service.spec.selector semantics: every key/value of `selector` is in `labels`. An empty or
// absent selector matches nothing (a Service without a selector has no managed endpoints).
bool SelectorMapMatches(const nlohmann::json& selector, const nlohmann::json& labels);

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_STORE_SELECTORS_H_
