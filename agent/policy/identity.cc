#include "agent/policy/identity.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "agent/base/errno.h"
#include "agent/base/files.h"
#include "nlohmann/json.hpp"

namespace sluice::agent {

std::string_view ReservedName(uint32_t identity) {
  switch (identity) {
    case SLUICE_IDENTITY_HOST:
      return "host";
    case SLUICE_IDENTITY_WORLD:
      return "world";
    case SLUICE_IDENTITY_UNMANAGED:
      return "unmanaged";
    case SLUICE_IDENTITY_REMOTE_NODE:
      return "remote-node";
    default:
      return "";
  }
}

LabelSet ReservedLabels(uint32_t identity) {
  std::string_view name = ReservedName(identity);
  if (name.empty()) return {};
  return {absl::StrCat(std::string(kReservedSource), std::string(name))};
}

IdentityAllocator::IdentityAllocator(uint32_t min_id, uint32_t max_id)
    : min_id_(min_id), max_id_(max_id), next_(min_id) {}

absl::Status IdentityAllocator::Restore(const std::vector<IdentityRecord>& records) {
  std::map<uint32_t, LabelSet> by_id;
  std::map<LabelSet, uint32_t> by_labels;
  uint32_t highest = 0;
  for (const IdentityRecord& r : records) {
    if (r.id < min_id_ || r.id > max_id_) {
      return absl::InvalidArgumentError(absl::StrCat("restore identity ", r.id,
                                                     ": outside ", min_id_, "..", max_id_));
    }
    if (!std::is_sorted(r.labels.begin(), r.labels.end()) ||
        std::adjacent_find(r.labels.begin(), r.labels.end()) != r.labels.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("restore identity ", r.id, ": labels not sorted and unique"));
    }
    for (uint32_t reserved = 1; reserved < SLUICE_IDENTITY_MIN_DYNAMIC; ++reserved) {
      if (ReservedName(reserved).empty()) break;
      if (r.labels == ReservedLabels(reserved)) {
        return absl::InvalidArgumentError(
            absl::StrCat("restore identity ", r.id, ": labels of a reserved identity"));
      }
    }
    if (!by_id.emplace(r.id, r.labels).second) {
      return absl::InvalidArgumentError(absl::StrCat("restore identity ", r.id, ": given twice"));
    }
    if (!by_labels.emplace(r.labels, r.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("restore identity ", r.id, ": label set already has a number"));
    }
    highest = std::max(highest, r.id);
  }
  by_id_ = std::move(by_id);
  by_labels_ = std::move(by_labels);
  next_ = highest == 0 || highest == max_id_ ? min_id_ : highest + 1;
  return absl::OkStatus();
}

std::optional<uint32_t> IdentityAllocator::NextFree() {
  const uint64_t span = uint64_t{max_id_} - min_id_ + 1;
  if (by_id_.size() >= span) return std::nullopt;
  for (uint64_t tried = 0; tried < span; ++tried) {
    uint32_t id = next_;
    next_ = next_ == max_id_ ? min_id_ : next_ + 1;
    if (!by_id_.contains(id)) return id;
  }
  return std::nullopt;
}

absl::Status IdentityAllocator::Assign(const std::set<LabelSet>& wanted) {
  // Release first, so that a full range frees room for new label sets.
  for (auto it = by_labels_.begin(); it != by_labels_.end();) {
    if (wanted.contains(it->first)) {
      ++it;
      continue;
    }
    by_id_.erase(it->second);
    it = by_labels_.erase(it);
  }
  size_t unnumbered = 0;
  for (const LabelSet& labels : wanted) {
    if (by_labels_.contains(labels)) continue;
    bool reserved = false;
    for (uint32_t r = SLUICE_IDENTITY_HOST; r <= SLUICE_IDENTITY_REMOTE_NODE; ++r) {
      if (labels == ReservedLabels(r)) reserved = true;
    }
    if (reserved) continue;
    std::optional<uint32_t> id = NextFree();
    if (!id) {
      ++unnumbered;
      continue;
    }
    by_id_[*id] = labels;
    by_labels_[labels] = *id;
  }
  if (unnumbered > 0) {
    return absl::ResourceExhaustedError(absl::StrCat("identities: ", unnumbered,
                                                     " label sets got no number (range ",
                                                     min_id_, "..", max_id_, " is full)"));
  }
  return absl::OkStatus();
}

std::optional<uint32_t> IdentityAllocator::Find(const LabelSet& labels) const {
  for (uint32_t r = SLUICE_IDENTITY_HOST; r <= SLUICE_IDENTITY_REMOTE_NODE; ++r) {
    if (labels == ReservedLabels(r)) return r;
  }
  auto it = by_labels_.find(labels);
  if (it == by_labels_.end()) return std::nullopt;
  return it->second;
}

const LabelSet* IdentityAllocator::Labels(uint32_t id) const {
  static const auto* const kReserved = [] {
    auto* m = new std::map<uint32_t, LabelSet>;
    for (uint32_t r = SLUICE_IDENTITY_HOST; r <= SLUICE_IDENTITY_REMOTE_NODE; ++r) {
      (*m)[r] = ReservedLabels(r);
    }
    return m;
  }();
  if (auto it = kReserved->find(id); it != kReserved->end()) return &it->second;
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

std::vector<IdentityRecord> IdentityAllocator::Records() const {
  std::vector<IdentityRecord> out;
  out.reserve(by_id_.size());
  for (const auto& [id, labels] : by_id_) out.push_back({id, labels});
  return out;
}

std::string IdentitiesToJson(const std::vector<IdentityRecord>& records) {
  nlohmann::json list = nlohmann::json::array();
  for (const IdentityRecord& r : records) {
    list.push_back({{"id", r.id}, {"labels", r.labels}});
  }
  return nlohmann::json{{"identities", list}}.dump();
}

absl::StatusOr<std::vector<IdentityRecord>> IdentitiesFromJson(std::string_view text) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("identities") ||
      !doc["identities"].is_array()) {
    return absl::InvalidArgumentError("identities: not {\"identities\": [...]}");
  }
  std::vector<IdentityRecord> out;
  for (const nlohmann::json& item : doc["identities"]) {
    if (!item.is_object() || !item.contains("id") || !item["id"].is_number_unsigned() ||
        !item.contains("labels") || !item["labels"].is_array()) {
      return absl::InvalidArgumentError("identities: an entry is not {\"id\": N, \"labels\": []}");
    }
    IdentityRecord r;
    uint64_t id = item["id"].get<uint64_t>();
    if (id > UINT32_MAX) return absl::InvalidArgumentError("identities: id out of range");
    r.id = static_cast<uint32_t>(id);
    for (const nlohmann::json& l : item["labels"]) {
      if (!l.is_string()) return absl::InvalidArgumentError("identities: a label is no string");
      r.labels.push_back(l.get<std::string>());
    }
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status SaveIdentities(const std::string& dir, const std::vector<IdentityRecord>& records) {
  return WriteFileAtomically(dir, kIdentityStateFile, IdentitiesToJson(records));
}

absl::StatusOr<std::vector<IdentityRecord>> LoadIdentities(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kIdentityStateFile);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::vector<IdentityRecord>{};
    return ErrnoStatus(errno, absl::StrCat("stat ", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, absl::StrCat("open ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  absl::StatusOr<std::vector<IdentityRecord>> records = IdentitiesFromJson(buf.str());
  if (!records.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", records.status().message()));
  }
  return records;
}

}  // namespace sluice::agent
