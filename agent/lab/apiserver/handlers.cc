// The resource endpoints: routing /api/v1/... and /apis/G/V/... to a resource, then create, get,
// replace, patch (JSON, merge, strategic merge), delete (one or a collection) and paginated list.
// Watches go to watch.cc.
#include <httplib.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/apiserver/internal.h"
#include "agent/lab/apiserver/merge_patch.h"
#include "agent/lab/apiserver/protobuf.h"
#include "agent/lab/apiserver/tables.h"

namespace sluice::lab {

using nlohmann::json;

nlohmann::json StatusObject(int code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
          {"status", "Failure"}, {"message", message}, {"reason", reason},
          {"code", code}};
}

void ReplyError(httplib::Response& res, const absl::Status& s, const ResourceType* type,
                const std::string& name) {
  std::string message(s.message());
  int code = 500;
  std::string reason = "InternalError";
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      code = 404, reason = "NotFound";
      break;
    case absl::StatusCode::kAlreadyExists:
      code = 409, reason = "AlreadyExists";
      break;
    case absl::StatusCode::kAborted:
      code = 409, reason = "Conflict";
      break;
    case absl::StatusCode::kInvalidArgument:
      code = 422, reason = "Invalid";
      break;
    case absl::StatusCode::kFailedPrecondition:
      code = 400, reason = "BadRequest";
      break;
    case absl::StatusCode::kOutOfRange:
      code = 410, reason = "Expired";
      break;
    case absl::StatusCode::kUnimplemented:
      code = 405, reason = "MethodNotAllowed";
      break;
    default:
      break;
  }
  json body = StatusObject(code, reason, message);
  if (type != nullptr) {
    body["details"] = {{"kind", type->plural}};
    if (!type->group.empty()) body["details"]["group"] = type->group;
    if (!name.empty()) body["details"]["name"] = name;
  }
  Reply(res, code, body);
}

namespace {

struct Route {
  const ResourceType* type = nullptr;
  std::string ns;
  std::string name;
  std::string subresource;
};

// /api/v1/... or /apis/G/V/... -> resource, namespace, name, subresource.
std::optional<Route> ParseRoute(const std::string& path) {
  std::vector<std::string> seg = absl::StrSplit(path, '/', absl::SkipEmpty());
  std::string group, version;
  size_t i = 0;
  if (seg.size() >= 3 && seg[0] == "api") {
    version = seg[1];
    i = 2;
  } else if (seg.size() >= 4 && seg[0] == "apis") {
    group = seg[1];
    version = seg[2];
    i = 3;
  } else {
    return std::nullopt;
  }
  Route r;
  if (seg.size() - i >= 3 && seg[i] == "namespaces") {
    const ResourceType* t = FindResource(group, version, seg[i + 2]);
    if (t != nullptr && t->namespaced) {
      r.type = t;
      r.ns = seg[i + 1];
      i += 3;
      if (i < seg.size()) r.name = seg[i++];
      if (i < seg.size()) r.subresource = seg[i++];
      if (i != seg.size()) return std::nullopt;
      return r;
    }
  }
  r.type = FindResource(group, version, seg[i++]);
  if (r.type == nullptr) return std::nullopt;
  if (i < seg.size()) r.name = seg[i++];
  if (i < seg.size()) r.subresource = seg[i++];
  if (i != seg.size()) return std::nullopt;
  if (!r.name.empty() && r.type->namespaced) return std::nullopt;  // needs /namespaces/NS/
  return r;
}

}  // namespace

void ApiServer::Handle(const httplib::Request& req, httplib::Response& res) {
  const std::string& path = req.path;
  if (path == "/lab/faults") return HandleFaults(req, res);
  if (req.method == "GET") {
    if (path == "/healthz" || path == "/livez" || path == "/readyz") {
      res.set_content("ok", "text/plain");
      return;
    }
    if (auto doc = DiscoveryDocument(path, absl::StrCat(options_.address, ":", port_))) {
      return Reply(res, 200, *doc);
    }
  }
  std::optional<Route> route = ParseRoute(path);
  if (route && route->type->plural == "pods" && route->subresource == "log" &&
      !route->name.empty()) {
    if (req.method != "GET") return ReplyStatus(res, 405, "MethodNotAllowed", "use GET");
    return HandlePodLog(req, res, route->ns, route->name);
  }
  if (!route || (!route->subresource.empty() && route->subresource != "status") ||
      (route->subresource == "status" && !route->type->has_status)) {
    return ReplyStatus(res, 404, "NotFound", "the server could not find the requested resource");
  }
  const ResourceType& type = *route->type;
  const std::string& ns = route->ns;
  const std::string& name = route->name;
  auto sub = route->subresource == "status" ? ObjectStore::Subresource::kStatus
                                            : ObjectStore::Subresource::kMain;

  auto parse_body = [&](json* out) -> bool {
    std::string content_type = req.get_header_value("Content-Type");
    if (content_type.substr(0, content_type.find(';')) == kProtobufContentType) {
      // kubectl's typed clients (create service, create namespace) send protobuf.
      auto decoded = DecodeK8sProtobuf(req.body);
      if (!decoded.ok()) {
        bool unsupported = decoded.status().code() == absl::StatusCode::kUnimplemented;
        ReplyStatus(res, unsupported ? 415 : 400,
                    unsupported ? "UnsupportedMediaType" : "BadRequest",
                    std::string(decoded.status().message()));
        return false;
      }
      *out = std::move(*decoded);
      return true;
    }
    *out = json::parse(req.body, nullptr, false);
    if (out->is_discarded() || !out->is_object()) {
      ReplyStatus(res, 400, "BadRequest", "the request body is not a JSON object");
      return false;
    }
    return true;
  };
  auto fix_namespace = [&](json& obj) -> bool {
    if (!type.namespaced) return true;
    std::string body_ns = obj["metadata"].value("namespace", "");
    if (!body_ns.empty() && body_ns != ns) {
      ReplyStatus(res, 400, "BadRequest",
                  "the namespace of the provided object does not match the namespace sent on "
                  "the request");
      return false;
    }
    obj["metadata"]["namespace"] = ns;
    return true;
  };

  if (req.method == "GET" && name.empty()) {
    if (ParamTrue(req, "watch")) return HandleWatch(req, res, type, ns);
    return HandleList(req, res, type, ns);
  }
  if (req.method == "GET") {
    auto obj = store_->Get(type, ns, name);
    if (!obj.ok()) return ReplyError(res, obj.status(), &type, name);
    if (auto table =
            TableRequested(req.get_header_value("Accept"), req.get_param_value("includeObject"))) {
      std::string rv = (*obj)["metadata"].value("resourceVersion", "");
      return Reply(res, 200,
                   TableOf(type, {std::make_shared<const json>(std::move(*obj))}, *table,
                           store_->clock()->Now(), rv));
    }
    return Reply(res, 200, *obj);
  }
  if (req.method == "POST" && name.empty()) {
    json obj;
    if (!parse_body(&obj) || !fix_namespace(obj)) return;
    auto created = store_->Create(type, std::move(obj));
    if (!created.ok()) return ReplyError(res, created.status(), &type);
    return Reply(res, 201, *created);
  }
  if (req.method == "PUT" && !name.empty()) {
    json obj;
    if (!parse_body(&obj) || !fix_namespace(obj)) return;
    std::string body_name = obj["metadata"].value("name", "");
    if (body_name.empty()) obj["metadata"]["name"] = name;
    if (!body_name.empty() && body_name != name) {
      return ReplyStatus(res, 400, "BadRequest",
                         "the name of the object does not match the name on the URL");
    }
    auto updated = store_->Replace(type, std::move(obj), sub);
    if (!updated.ok()) return ReplyError(res, updated.status(), &type, name);
    return Reply(res, 200, *updated);
  }
  if (req.method == "PATCH" && !name.empty()) {
    std::string content_type = req.get_header_value("Content-Type");
    std::string kind = content_type.substr(0, content_type.find(';'));
    if (kind != "application/merge-patch+json" &&
        kind != "application/strategic-merge-patch+json" && kind != "application/json-patch+json") {
      return ReplyStatus(res, 415, "UnsupportedMediaType",
                         absl::StrCat("the body of the request was in an unknown format - "
                                      "accepted media types include: application/json-patch+json, "
                                      "application/merge-patch+json, "
                                      "application/strategic-merge-patch+json (got ",
                                      content_type, ")"));
    }
    json patch = json::parse(req.body, nullptr, false);
    if (patch.is_discarded()) return ReplyStatus(res, 400, "BadRequest", "invalid patch body");
    auto updated = store_->Update(
        type, ns, name,
        [&](json& current) -> absl::Status {
          std::string rv = current["metadata"].value("resourceVersion", "");
          json patched;
          if (kind == "application/json-patch+json") {
            if (!patch.is_array()) return absl::FailedPreconditionError("a JSON patch is a list");
            try {
              patched = current.patch(patch);
            } catch (const json::exception& e) {
              return absl::InvalidArgumentError(absl::StrCat("json patch: ", e.what()));
            }
          } else if (!patch.is_object()) {
            return absl::FailedPreconditionError("a merge patch must be a JSON object");
          } else if (kind == "application/merge-patch+json") {
            patched = current;
            patched.merge_patch(patch);
          } else {
            patched = StrategicMergePatch(current, patch);
          }
          if (!patched.is_object() || !patched["metadata"].is_object()) {
            return absl::FailedPreconditionError("the patch removed the object's metadata");
          }
          std::string want = patched["metadata"].value("resourceVersion", "");
          if (!want.empty() && want != rv) {
            return absl::AbortedError(absl::StrCat(
                "Operation cannot be fulfilled on ", QualifiedResource(type), " \"", name,
                "\": the object has been modified; please apply your changes to the latest "
                "version and try again"));
          }
          current = std::move(patched);
          return absl::OkStatus();
        },
        sub);
    if (!updated.ok()) return ReplyError(res, updated.status(), &type, name);
    return Reply(res, 200, *updated);
  }
  if (req.method == "DELETE") {
    ObjectStore::DeleteOptions opts;
    json body = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
    if (body.is_discarded()) return ReplyStatus(res, 400, "BadRequest", "invalid DeleteOptions");
    if (body.is_object()) {
      if (body.contains("gracePeriodSeconds") && body["gracePeriodSeconds"].is_number_integer()) {
        opts.grace_period_seconds = body["gracePeriodSeconds"].get<int64_t>();
      }
      if (body.contains("preconditions") && body["preconditions"].is_object()) {
        opts.precondition_uid = body["preconditions"].value("uid", "");
        opts.precondition_resource_version = body["preconditions"].value("resourceVersion", "");
      }
    }
    int64_t grace = 0;
    if (req.has_param("gracePeriodSeconds") &&
        absl::SimpleAtoi(req.get_param_value("gracePeriodSeconds"), &grace)) {
      opts.grace_period_seconds = grace;
    }
    std::vector<std::string> names;
    if (!name.empty()) {
      names.push_back(name);
    } else {
      ListOptions lo;
      lo.namespace_name = ns;
      auto labels = LabelSelector::Parse(req.get_param_value("labelSelector"));
      auto fields = FieldSelector::Parse(req.get_param_value("fieldSelector"), type.plural);
      if (!labels.ok() || !fields.ok()) return ReplyStatus(res, 400, "BadRequest", "bad selector");
      lo.labels = *labels;
      lo.fields = *fields;
      auto list = store_->List(type, lo);
      if (!list.ok()) return ReplyError(res, list.status(), &type);
      for (const ObjectPtr& o : list->items) names.push_back((*o)["metadata"].value("name", ""));
    }
    json last;
    for (const std::string& n : names) {
      std::string obj_ns = ns;
      auto result = store_->Delete(type, obj_ns, n, opts);
      if (!result.ok()) {
        if (!name.empty()) return ReplyError(res, result.status(), &type, n);
        continue;
      }
      if (!name.empty() && !result->deleted) return Reply(res, 200, result->object);
      last = result->object;
    }
    json status = {{"kind", "Status"},
                   {"apiVersion", "v1"},
                   {"metadata", json::object()},
                   {"status", "Success"},
                   {"details", {{"kind", type.plural}}}};
    if (!type.group.empty()) status["details"]["group"] = type.group;
    if (!name.empty()) {
      status["details"]["name"] = name;
      status["details"]["uid"] = last["metadata"].value("uid", "");
    }
    return Reply(res, 200, status);
  }
  ReplyStatus(res, 405, "MethodNotAllowed",
              absl::StrCat(req.method, " is not supported on ", path));
}

// GET pods/NAME/log: what the pod's processes wrote (its netexec servers: a start line and a
// line per request; a container's `command`), as text/plain. tailLines and limitBytes are
// honoured; follow serves what is there now and ends.
void ApiServer::HandlePodLog(const httplib::Request& req, httplib::Response& res,
                             const std::string& ns, const std::string& name) {
  const ResourceType& pods = Resource("pods");
  auto pod = store_->Get(pods, ns, name);
  if (!pod.ok()) return ReplyError(res, pod.status(), &pods, name);
  std::vector<std::string> containers;
  for (const auto& c : (*pod)["spec"].value("containers", json::array())) {
    containers.push_back(c.value("name", ""));
  }
  std::string container = req.get_param_value("container");
  if (container.empty()) {
    if (containers.size() != 1) {
      return ReplyStatus(res, 400, "BadRequest",
                         absl::StrCat("a container name must be specified for pod ", name,
                                      ", choose one of: [", absl::StrJoin(containers, " "), "]"));
    }
    container = containers.front();
  } else if (std::find(containers.begin(), containers.end(), container) == containers.end()) {
    return ReplyStatus(res, 400, "BadRequest",
                       absl::StrCat("container ", container, " is not valid for pod ", name));
  }
  if (ParamTrue(req, "previous")) {
    return ReplyStatus(res, 400, "BadRequest",
                       absl::StrCat("previous terminated container \"", container, "\" in pod \"",
                                    name, "\" not found"));
  }
  std::string text;
  bool have_log = false;
  if (!options_.pod_log_dir.empty() && (*pod)["status"].value("phase", "") == "Running") {
    std::ifstream in(absl::StrCat(options_.pod_log_dir, "/", ns, "_", name, ".log"),
                     std::ios::binary);
    if (in) {
      have_log = true;
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  if (!have_log) {
    return ReplyStatus(res, 400, "BadRequest",
                       absl::StrCat("container \"", container, "\" in pod \"", name,
                                    "\" is waiting to start: ContainerCreating"));
  }
  int64_t tail = -1;
  if (req.has_param("tailLines") && absl::SimpleAtoi(req.get_param_value("tailLines"), &tail) &&
      tail >= 0) {
    const bool trailing_newline = !text.empty() && text.back() == '\n';
    std::vector<std::string> lines = absl::StrSplit(text, '\n');
    if (trailing_newline) lines.pop_back();
    size_t from = lines.size() > static_cast<size_t>(tail) ? lines.size() - tail : 0;
    std::string kept;
    for (size_t i = from; i < lines.size(); ++i) absl::StrAppend(&kept, lines[i], "\n");
    if (!trailing_newline && !kept.empty()) kept.pop_back();
    text = std::move(kept);
  }
  int64_t limit = 0;
  if (req.has_param("limitBytes") && absl::SimpleAtoi(req.get_param_value("limitBytes"), &limit) &&
      limit > 0 && static_cast<size_t>(limit) < text.size()) {
    text.resize(limit);
  }
  res.status = 200;
  res.set_content(text, "text/plain");
}

void ApiServer::HandleList(const httplib::Request& req, httplib::Response& res,
                           const ResourceType& type, const std::string& ns) {
  ListOptions opts;
  opts.namespace_name = ns;
  if (!ParseSelectors(req, type, res, &opts.labels, &opts.fields)) return;
  if (req.has_param("limit") && !absl::SimpleAtoi(req.get_param_value("limit"), &opts.limit)) {
    return ReplyStatus(res, 400, "BadRequest", "limit must be an integer");
  }
  opts.continue_token = req.get_param_value("continue");
  size_t slow_chunk = 0;
  absl::Duration slow_pause;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!opts.continue_token.empty() && expire_continues_ > 0) {
      --expire_continues_;
      return ReplyError(res,
                        absl::OutOfRangeError(
                            "The provided continue parameter is too old to display a consistent "
                            "list result. You can start a new list without the continue "
                            "parameter."),
                        &type);
    }
    slow_chunk = slow_list_chunk_;
    slow_pause = slow_list_pause_;
  }
  auto list = store_->List(type, opts);
  if (!list.ok()) return ReplyError(res, list.status(), &type);
  if (auto table =
          TableRequested(req.get_header_value("Accept"), req.get_param_value("includeObject"))) {
    // kubectl's server-side printing: the columns kube-apiserver's printers give this resource.
    return Reply(res, 200,
                 TableOf(type, list->items, *table, store_->clock()->Now(),
                         std::to_string(list->resource_version), list->continue_token));
  }
  std::string out =
      absl::StrCat("{\"kind\":\"", type.kind, "List\",\"apiVersion\":\"", type.ApiVersion(),
                   "\",\"metadata\":{\"resourceVersion\":\"", list->resource_version, "\"");
  if (!list->continue_token.empty()) {
    absl::StrAppend(&out, ",\"continue\":\"", list->continue_token, "\"");
  }
  absl::StrAppend(&out, "},\"items\":[");
  for (size_t i = 0; i < list->items.size(); ++i) {
    if (i > 0) out.push_back(',');
    out += list->items[i]->dump();
  }
  out += "]}";
  res.status = 200;
  if (slow_chunk == 0) return res.set_content(out, kJson);
  auto body = std::make_shared<std::string>(std::move(out));
  res.set_chunked_content_provider(
      kJson, [this, body, slow_chunk, slow_pause](size_t offset, httplib::DataSink& sink) {
        if (offset >= body->size()) {
          sink.done();
          return true;
        }
        {
          // The server being slow (not waiting for anything); a Stop() cuts the wait short.
          std::unique_lock<std::mutex> lock(mu_);
          if (stall_cv_.wait_for(lock, absl::ToChronoNanoseconds(slow_pause),
                                 [this] { return stopping_ || server_ == nullptr; })) {
            return false;
          }
        }
        return sink.write(body->data() + offset, std::min(slow_chunk, body->size() - offset));
      });
}

}  // namespace sluice::lab
