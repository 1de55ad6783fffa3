// Decoding of apiserver JSON into the trimmed model with simdjson On-Demand: one object at a time
// (list items and watch events come from the framers in framing.h), no DOM, unknown fields skipped.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "agent/k8s/model.h"

namespace sluice::k8s {

// metadata of a list response.
struct ListMeta {
  std::string resource_version;
  std::string continue_token;
  int64_t remaining_item_count = -1;  // -1 when absent
};

enum class EventType : uint8_t { kAdded, kModified, kDeleted, kBookmark, kError, kUnknown };
std::string_view EventTypeName(EventType t);

// A watch event before its object is decoded (the object's kind depends on the type: ERROR
// carries a Status).
struct RawEvent {
  EventType type = EventType::kUnknown;
  std::string type_name;
  std::string object_json;
};

// Reusable decoder (owns a simdjson parser and a padded buffer). Not thread-safe: one per thread.
// Every Decode* fully replaces *out; on error *out is unspecified and the status says what failed.
class Decoder {
 public:
  Decoder();
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  absl::Status Decode(std::string_view json, Service* out);
  absl::Status Decode(std::string_view json, EndpointSlice* out);
  absl::Status Decode(std::string_view json, Pod* out);
  absl::Status Decode(std::string_view json, Namespace* out);
  absl::Status Decode(std::string_view json, Node* out);
  absl::Status Decode(std::string_view json, NetworkPolicy* out);
  absl::Status Decode(std::string_view json, ApiStatus* out);
  absl::Status Decode(std::string_view json, ListMeta* out);
  absl::Status Decode(std::string_view json, RawEvent* out);

  // Only metadata.resourceVersion of an object of any kind (BOOKMARK events).
  absl::Status DecodeResourceVersion(std::string_view json, std::string* rv);
  // Only the object's identity (metadata namespace, name, uid, resourceVersion), skipping every
  // other field unread: what a DELETED event, or the removal of an object the full decode
  // refuses, needs. Fails only when the JSON is malformed or the name is missing.
  absl::Status DecodeIdentity(std::string_view json, ObjectMeta* out);

 private:
  // simdjson's parser and the padded copy of the input: kept out of this header, which half of
  // the agent includes, because simdjson.h alone costs seconds per translation unit.
  struct Parser;

  template <typename Fn>
  absl::Status Run(std::string_view json, std::string_view what, Fn&& fn);

  std::unique_ptr<Parser> parser_;
};

struct ListDecodeStats {
  size_t items = 0;   // decoded and delivered
  size_t errors = 0;  // items that failed to decode (skipped)
  absl::Status first_error;
};

// Decodes a whole list response body item by item (the body need not be in one piece for the
// reflector, which feeds ListFramer directly; this is the same path for a complete body).
// Items that fail to decode are counted and skipped; a malformed list envelope is an error.
template <typename T>
absl::Status DecodeListBody(std::string_view body, ListMeta* meta,
                            const std::function<void(T&&)>& on_item, ListDecodeStats* stats);

}  // namespace sluice::k8s

#include "agent/k8s/framing.h"

namespace sluice::k8s {

template <typename T>
absl::Status DecodeListBody(std::string_view body, ListMeta* meta,
                            const std::function<void(T&&)>& on_item, ListDecodeStats* stats) {
  Decoder decoder;
  ListFramer framer;
  ListFramer::Callbacks cb;
  cb.on_metadata = [&](std::string_view json) { return decoder.Decode(json, meta); };
  cb.on_item = [&](std::string_view json) {
    T obj;
    absl::Status st = decoder.Decode(json, &obj);
    if (!st.ok()) {
      ++stats->errors;
      if (stats->first_error.ok()) stats->first_error = st;
      return absl::OkStatus();
    }
    ++stats->items;
    on_item(std::move(obj));
    return absl::OkStatus();
  };
  absl::Status st = framer.Feed(body, cb);
  if (!st.ok()) return st;
  return framer.Finish();
}

}  // namespace sluice::k8s
