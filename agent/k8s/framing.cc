#include "agent/k8s/framing.h"

#include "absl/strings/str_cat.h"

namespace sluice::k8s {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

}  // namespace

void EventFramer::Reset() {
  buf_.clear();
  depth_ = 0;
  in_string_ = false;
  escape_ = false;
}

absl::Status EventFramer::Feed(std::string_view bytes, const ObjectFn& on_object) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    if (depth_ == 0) {
      const char c = bytes[i];
      if (IsSpace(c)) {
        ++i;
        continue;
      }
      if (c != '{') {
        return absl::DataLossError(
            absl::StrCat("watch stream: unexpected byte 0x", absl::Hex(static_cast<uint8_t>(c)),
                         " between events"));
      }
      buf_.clear();
      // Fall through into the object scan with depth 0; the '{' below raises it to 1.
    }
    const size_t start = i;
    for (; i < n; ++i) {
      const char c = bytes[i];
      if (in_string_) {
        if (escape_) {
          escape_ = false;
        } else if (c == '\\') {
          escape_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
        continue;
      }
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if (c == '}' || c == ']') {
        if (--depth_ == 0) {
          ++i;
          break;
        }
      }
    }
    buf_.append(bytes.data() + start, i - start);
    if (buf_.size() > max_object_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("watch stream: event larger than ", max_object_bytes_, " bytes"));
    }
    if (depth_ == 0) {
      absl::Status st = on_object(buf_);
      buf_.clear();
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::Status ListFramer::Fail(std::string_view what) {
  failed_ = true;
  return absl::DataLossError(absl::StrCat("list body: ", std::string(what)));
}

absl::Status ListFramer::Feed(std::string_view bytes, const Callbacks& callbacks) {
  if (failed_) return absl::FailedPreconditionError("list body: framer already failed");
  const size_t n = bytes.size();
  // Start of the captured bytes within `bytes` (capture_ != kNone).
  size_t seg = 0;
  for (size_t i = 0; i < n; ++i) {
    const char c = bytes[i];
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
        in_key_ = false;
      } else if (in_key_) {
        key_.push_back(c);
      }
      continue;
    }
    if (IsSpace(c)) continue;
    if (done_) return Fail("trailing bytes after the list object");
    switch (c) {
      case '"':
        in_string_ = true;
        if (depth_ == 1 && expect_key_) {
          in_key_ = true;
          key_.clear();
        }
        break;
      case '{':
      case '[':
        if (depth_ == 0) {
          if (c != '{') return Fail("not a JSON object");
          expect_key_ = true;
        } else if (depth_ == 1) {
          if (key_ == "metadata" && c == '{') {
            capture_ = Capture::kMetadata;
            buf_.clear();
            seg = i;
          } else if (key_ == "items" && c == '[') {
            in_items_ = true;
          }
        } else if (depth_ == 2 && in_items_) {
          if (c != '{') return Fail("an item is not an object");
          capture_ = Capture::kItem;
          buf_.clear();
          seg = i;
        }
        ++depth_;
        break;
      case '}':
      case ']':
        --depth_;
        if (depth_ < 0) return Fail("unbalanced brackets");
        if ((capture_ == Capture::kMetadata && depth_ == 1) ||
            (capture_ == Capture::kItem && depth_ == 2)) {
          buf_.append(bytes.data() + seg, i + 1 - seg);
          const Capture done = capture_;
          capture_ = Capture::kNone;
          if (buf_.size() > max_object_bytes_) return Fail("object over the size limit");
          const auto& fn = done == Capture::kMetadata ? callbacks.on_metadata : callbacks.on_item;
          if (fn) {
            absl::Status st = fn(buf_);
            if (!st.ok()) return st;
          }
          buf_.clear();
        } else if (depth_ == 1 && in_items_) {
          in_items_ = false;
        } else if (depth_ == 0) {
          done_ = true;
        }
        break;
      case ':':
        if (depth_ == 1) expect_key_ = false;
        break;
      case ',':
        if (depth_ == 1) expect_key_ = true;
        break;
      default:
        if (depth_ == 0) return Fail("not a JSON object");
        if (depth_ == 2 && in_items_) return Fail("an item is not an object");
        break;
    }
  }
  if (capture_ != Capture::kNone) {
    buf_.append(bytes.data() + seg, n - seg);
    if (buf_.size() > max_object_bytes_) return Fail("object over the size limit");
  }
  return absl::OkStatus();
}

absl::Status ListFramer::Finish() const {
  if (failed_) return absl::DataLossError("list body: malformed");
  if (!done_) return absl::DataLossError("list body: truncated");
  return absl::OkStatus();
}

}  // namespace sluice::k8s
