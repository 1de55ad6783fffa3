// Framing of apiserver response bodies as they arrive, independent of HTTP chunk boundaries:
// watch streams into whole event objects, list responses into their metadata and single items, so
// that memory stays O(largest object) even for a 100k-item list that ignored `limit`.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace sluice::k8s {

// Splits a byte stream of concatenated top-level JSON objects (a watch stream: one event per line)
// into whole objects. Brace-depth framing that is aware of strings and escapes, so a newline or a
// brace inside a string value cannot split an event. Bytes of an object cut by the end of the
// stream are never delivered.
class EventFramer {
 public:
  using ObjectFn = std::function<absl::Status(std::string_view object_json)>;

  explicit EventFramer(size_t max_object_bytes = 64 << 20) : max_object_bytes_(max_object_bytes) {}

  // Feeds the next bytes; calls `on_object` for every object completed by them. Anything but
  // whitespace between objects, or an object over the size limit, is an error after which the
  // framer must be Reset(). An error returned by `on_object` stops framing and is returned.
  absl::Status Feed(std::string_view bytes, const ObjectFn& on_object);

  // True when the bytes of an unfinished object are buffered (a stream ending now was cut).
  bool HasPartial() const { return depth_ > 0; }
  size_t partial_bytes() const { return buf_.size(); }
  void Reset();

 private:
  size_t max_object_bytes_;
  std::string buf_;
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
};

// Incremental framer for a list response {"kind":..,"metadata":{..},"items":[{..},{..}]}: hands out
// the metadata object and each item as raw JSON while the body is still arriving. Members other than
// metadata and items are skipped; "items": null is an empty list.
class ListFramer {
 public:
  struct Callbacks {
    std::function<absl::Status(std::string_view)> on_metadata;
    std::function<absl::Status(std::string_view)> on_item;
  };

  explicit ListFramer(size_t max_object_bytes = 64 << 20) : max_object_bytes_(max_object_bytes) {}

  absl::Status Feed(std::string_view bytes, const Callbacks& callbacks);
  // Error unless exactly one complete top-level object was fed.
  absl::Status Finish() const;

 private:
  enum class Capture { kNone, kMetadata, kItem };

  absl::Status Fail(std::string_view what);

  size_t max_object_bytes_;
  std::string buf_;  // bytes of the metadata object or item being captured
  std::string key_;  // the current member name of the root object
  Capture capture_ = Capture::kNone;
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
  bool in_key_ = false;
  bool expect_key_ = false;
  bool in_items_ = false;
  bool done_ = false;
  bool failed_ = false;
};

}  // namespace sluice::k8s
