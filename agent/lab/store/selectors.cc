#include "agent/lab/store/selectors.h"

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sluice::lab {
namespace {

using nlohmann::json;

std::string Trim(std::string_view s) {
  return std::string(absl::StripAsciiWhitespace(absl::string_view(s.data(), s.size())));
}

// Splits at commas that are not inside parentheses.
std::vector<std::string> SplitTopLevel(std::string_view text) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '(') depth++;
    if (c == ')') depth--;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  parts.push_back(cur);
  return parts;
}

const json* LabelValue(const json& labels, const std::string& key) {
  if (!labels.is_object()) return nullptr;
  auto it = labels.find(key);
  if (it == labels.end() || !it->is_string()) return nullptr;
  return &*it;
}

bool ValidKey(const std::string& key) {
  if (key.empty() || key.size() > 316) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
           c == '/';
  });
}

}  // namespace

absl::StatusOr<LabelSelector> LabelSelector::Parse(std::string_view text) {
  LabelSelector sel;
  if (Trim(text).empty()) return sel;
  for (const std::string& raw : SplitTopLevel(text)) {
    std::string part = Trim(raw);
    if (part.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unable to parse requirement: empty requirement in \"", std::string(text), "\""));
    }
    Requirement req;
    size_t paren = part.find('(');
    if (part[0] == '!') {
      req.key = Trim(part.substr(1));
      req.op = Op::kDoesNotExist;
    } else if (paren != std::string::npos) {
      if (part.back() != ')') {
        return absl::InvalidArgumentError(absl::StrCat("unable to parse requirement: ", part));
      }
      std::vector<std::string> head =
          absl::StrSplit(part.substr(0, paren), ' ', absl::SkipWhitespace());
      if (head.size() != 2 || (head[1] != "in" && head[1] != "notin")) {
        return absl::InvalidArgumentError(absl::StrCat("unable to parse requirement: ", part));
      }
      req.key = head[0];
      req.op = head[1] == "in" ? Op::kIn : Op::kNotIn;
      std::string inner = part.substr(paren + 1, part.size() - paren - 2);
      for (absl::string_view v : absl::StrSplit(inner, ',')) {
        req.values.push_back(Trim(std::string_view(v.data(), v.size())));
      }
    } else if (size_t p = part.find("!="); p != std::string::npos) {
      req.key = Trim(part.substr(0, p));
      req.op = Op::kNotEquals;
      req.values.push_back(Trim(part.substr(p + 2)));
    } else if (size_t p = part.find("=="); p != std::string::npos) {
      req.key = Trim(part.substr(0, p));
      req.op = Op::kEquals;
      req.values.push_back(Trim(part.substr(p + 2)));
    } else if (size_t p = part.find('='); p != std::string::npos) {
      req.key = Trim(part.substr(0, p));
      req.op = Op::kEquals;
      req.values.push_back(Trim(part.substr(p + 1)));
    } else {
      req.key = part;
      req.op = Op::kExists;
    }
    if (!ValidKey(req.key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unable to parse requirement: invalid label key \"", req.key, "\""));
    }
    sel.requirements_.push_back(std::move(req));
  }
  return sel;
}

bool LabelSelector::Matches(const json& labels) const {
  for (const Requirement& r : requirements_) {
    const json* v = LabelValue(labels, r.key);
    switch (r.op) {
      case Op::kExists:
        if (v == nullptr) return false;
        break;
      case Op::kDoesNotExist:
        if (v != nullptr) return false;
        break;
      case Op::kEquals:
        if (v == nullptr || v->get<std::string>() != r.values[0]) return false;
        break;
      case Op::kNotEquals:
        if (v != nullptr && v->get<std::string>() == r.values[0]) return false;
        break;
      case Op::kIn:
        if (v == nullptr ||
            std::find(r.values.begin(), r.values.end(), v->get<std::string>()) == r.values.end()) {
          return false;
        }
        break;
      case Op::kNotIn:
        if (v != nullptr &&
            std::find(r.values.begin(), r.values.end(), v->get<std::string>()) != r.values.end()) {
          return false;
        }
        break;
    }
  }
  return true;
}

absl::StatusOr<FieldSelector> FieldSelector::Parse(std::string_view text, std::string_view plural) {
  FieldSelector sel;
  if (Trim(text).empty()) return sel;
  for (const std::string& raw : SplitTopLevel(text)) {
    std::string part = Trim(raw);
    Requirement req;
    size_t p;
    if ((p = part.find("!=")) != std::string::npos) {
      req.field = Trim(part.substr(0, p));
      req.equals = false;
      req.value = Trim(part.substr(p + 2));
    } else if ((p = part.find("==")) != std::string::npos) {
      req.field = Trim(part.substr(0, p));
      req.equals = true;
      req.value = Trim(part.substr(p + 2));
    } else if ((p = part.find('=')) != std::string::npos) {
      req.field = Trim(part.substr(0, p));
      req.equals = true;
      req.value = Trim(part.substr(p + 1));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid field selector: '", part, "': no operator"));
    }
    bool ok = req.field == "metadata.name" || req.field == "metadata.namespace";
    if (plural == "pods") {
      ok = ok || req.field == "spec.nodeName" || req.field == "status.phase" ||
           req.field == "status.podIP";
    }
    if (plural == "services") ok = ok || req.field == "spec.type";
    if (plural == "events") {
      // What `kubectl describe` selects an object's events by, and kube-apiserver's other
      // event field labels.
      static const std::set<std::string> kEventFields = {"involvedObject.kind",
                                                         "involvedObject.namespace",
                                                         "involvedObject.name",
                                                         "involvedObject.uid",
                                                         "involvedObject.apiVersion",
                                                         "involvedObject.fieldPath",
                                                         "involvedObject.resourceVersion",
                                                         "reason",
                                                         "reportingComponent",
                                                         "type"};
      ok = ok || kEventFields.contains(req.field);
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("field label not supported: ", req.field));
    }
    sel.requirements_.push_back(std::move(req));
  }
  return sel;
}

bool FieldSelector::Matches(const json& object) const {
  for (const Requirement& r : requirements_) {
    const json* cur = &object;
    for (absl::string_view seg : absl::StrSplit(r.field, '.')) {
      if (cur == nullptr || !cur->is_object()) {
        cur = nullptr;
        break;
      }
      auto it = cur->find(std::string(seg));
      cur = it == cur->end() ? nullptr : &*it;
    }
    std::string value = (cur != nullptr && cur->is_string()) ? cur->get<std::string>() : "";
    if ((value == r.value) != r.equals) return false;
  }
  return true;
}

bool SelectorMapMatches(const json& selector, const json& labels) {
  if (!selector.is_object() || selector.empty()) return false;
  for (auto it = selector.begin(); it != selector.end(); ++it) {
    const json* v = LabelValue(labels, it.key());
    if (v == nullptr || *v != it.value()) return false;
  }
  return true;
}

}  // namespace sluice::lab
