#include "agent/policy/identity.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

namespace {

// The reserved identity whose label set `labels` is, or 0; without building the sets again.
uint32_t ReservedIdentityOf(const LabelSet& labels) {
  if (labels.size() != 1 || !labels[0].starts_with(kReservedSource)) return 0;
  static const auto* const kSets = [] {
    auto* v = new std::vector<std::pair<LabelSet, uint32_t>>;
    for (uint32_t r = SLUICE_IDENTITY_HOST; r <= SLUICE_IDENTITY_REMOTE_NODE; ++r) {
      v->emplace_back(ReservedLabels(r), r);
    }
    return v;
  }();
  for (const auto& [set, id] : *kSets) {
    if (set == labels) return id;
  }
  return 0;
}

}  // namespace

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
  ++generation_;
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
  std::vector<const LabelSet*> sorted;
  sorted.reserve(wanted.size());
  for (const LabelSet& labels : wanted) sorted.push_back(&labels);
  return Assign(sorted);
}

absl::Status IdentityAllocator::Assign(const std::vector<const LabelSet*>& wanted) {
  // Release first, so that a full range frees room for new label sets. Both sides are sorted:
  // one walk.
  size_t w = 0;
  for (auto it = by_labels_.begin(); it != by_labels_.end();) {
    while (w < wanted.size() && *wanted[w] < it->first) ++w;
    if (w < wanted.size() && *wanted[w] == it->first) {
      ++it;
      continue;
    }
    by_id_.erase(it->second);
    it = by_labels_.erase(it);
    ++generation_;
  }
  size_t unnumbered = 0;
  auto next = by_labels_.begin();  // the first numbered set not below the current wanted one
  for (const LabelSet* labels : wanted) {
    while (next != by_labels_.end() && next->first < *labels) ++next;
    if (next != by_labels_.end() && next->first == *labels) continue;
    if (ReservedIdentityOf(*labels) != 0) continue;
    std::optional<uint32_t> id = NextFree();
    if (!id) {
      ++unnumbered;
      continue;
    }
    by_id_[*id] = *labels;
    next = std::next(by_labels_.emplace_hint(next, *labels, *id));
    ++generation_;
  }
  if (unnumbered > 0) {
    return absl::ResourceExhaustedError(absl::StrCat("identities: ", unnumbered,
                                                     " label sets got no number (range ",
                                                     min_id_, "..", max_id_, " is full)"));
  }
  return absl::OkStatus();
}

std::optional<uint32_t> IdentityAllocator::Find(const LabelSet& labels) const {
  if (uint32_t r = ReservedIdentityOf(labels); r != 0) return r;
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

namespace {

// A JSON string literal of `s` (valid UTF-8, as the decoder admits label text).
void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      absl::StrAppend(out, absl::StrFormat("\\u%04x", u));
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

}  // namespace

std::string IdentitiesToJson(const std::vector<IdentityRecord>& records) {
  // Written by hand: the file is rewritten on every numbering change, on the policy batch's
  // path, and building a json tree of thousands of label sets first costs ~10 ms.
  std::string out = R"({"identities":[)";
  bool first = true;
  for (const IdentityRecord& r : records) {
    if (!first) out.push_back(',');
    first = false;
    absl::StrAppend(&out, R"({"id":)", r.id, R"(,"labels":[)");
    for (size_t i = 0; i < r.labels.size(); ++i) {
      if (i > 0) out.push_back(',');
      AppendJsonString(&out, r.labels[i]);
    }
    out += "]}";
  }
  out += "]}";
  return out;
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
  // The numbers describe the pinned maps, which a node crash clears too: surviving the agent's
  // own crash is enough, and an fsync per change would cost the policy batch tens of ms.
  return WriteFileAtomically(dir, kIdentityStateFile, IdentitiesToJson(records), 0600,
                             Durability::kProcessCrash);
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
