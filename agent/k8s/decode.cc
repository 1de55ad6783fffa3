#include "agent/k8s/decode.h"

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "simdjson.h"

// simdjson's exception API is used inside this file only (it keeps field-by-field decoding
// readable); Decoder::Run turns every simdjson_error into an absl::Status at the boundary.
namespace sluice::k8s {
namespace {

namespace od = simdjson::ondemand;
using od::json_type;

bool IsNull(od::value& v) { return v.type() == json_type::null; }

std::string Str(od::value v) {
  if (IsNull(v)) return {};
  return std::string(std::string_view(v.get_string()));
}

int32_t Int32(od::value v) {
  if (IsNull(v)) return 0;
  int64_t x = v.get_int64();
  if (x < INT32_MIN || x > INT32_MAX) throw simdjson::simdjson_error(simdjson::NUMBER_OUT_OF_RANGE);
  return static_cast<int32_t>(x);
}

bool Bool(od::value v) {
  if (IsNull(v)) return false;
  return v.get_bool();
}

StringMap StrMap(od::value v) {
  StringMap m;
  if (IsNull(v)) return m;
  for (auto field : v.get_object()) {
    std::string key(std::string_view(field.unescaped_key()));
    m[std::move(key)] = Str(field.value());
  }
  return m;
}

std::vector<std::string> StrList(od::value v) {
  std::vector<std::string> out;
  if (IsNull(v)) return out;
  for (auto el : v.get_array()) out.push_back(Str(el.value()));
  return out;
}

// Calls fn(key, value) for each member of an object value; null is an empty object.
template <typename Fn>
void ForFields(od::value v, Fn&& fn) {
  if (IsNull(v)) return;
  for (auto field : v.get_object()) {
    std::string_view key = field.unescaped_key();
    od::value val = field.value();
    fn(key, val);
  }
}

template <typename Fn>
void ForFields(od::object o, Fn&& fn) {
  for (auto field : o) {
    std::string_view key = field.unescaped_key();
    od::value val = field.value();
    fn(key, val);
  }
}

// Calls fn(value) for each element of an array value; null is an empty array.
template <typename Fn>
void ForElements(od::value v, Fn&& fn) {
  if (IsNull(v)) return;
  for (auto el : v.get_array()) {
    od::value val = el.value();
    fn(val);
  }
}

void DecodeMeta(od::value v, ObjectMeta* m) {
  ForFields(v, [&](std::string_view key, od::value& val) {
    if (key == "name") {
      m->name = Str(val);
    } else if (key == "namespace") {
      m->namespace_ = Str(val);
    } else if (key == "uid") {
      m->uid = Str(val);
    } else if (key == "resourceVersion") {
      m->resource_version = Str(val);
    } else if (key == "labels") {
      m->labels = StrMap(val);
    } else if (key == "annotations") {
      StringMap all = StrMap(val);  // validated; only the few the agent reads are kept
      for (auto& [k, v] : all) {
        if (KeptAnnotation(k)) m->annotations.emplace(k, std::move(v));
      }
    } else if (key == "deletionTimestamp") {
      m->deleting = !IsNull(val);
    } else if (key == "ownerReferences") {
      // Validated, not kept.
      ForElements(val, [&](od::value& ref_v) {
        ForFields(ref_v, [&](std::string_view k, od::value& x) {
          if (k == "kind" || k == "name" || k == "uid") {
            Str(x);
          } else if (k == "controller") {
            Bool(x);
          }
        });
      });
    }
  });
}

// Conditions list [{type, status}] -> whether `type` is "True".
bool ConditionTrue(od::value v, std::string_view type) {
  bool result = false;
  ForElements(v, [&](od::value& cond) {
    std::string t, s;
    ForFields(cond, [&](std::string_view k, od::value& x) {
      if (k == "type") {
        t = Str(x);
      } else if (k == "status") {
        s = Str(x);
      }
    });
    if (t == type) result = s == "True";
  });
  return result;
}

void DecodeServiceSpec(od::value v, Service* s, std::string* cluster_ip) {
  ForFields(v, [&](std::string_view key, od::value& val) {
    if (key == "type") {
      s->type = Str(val);
    } else if (key == "clusterIP") {
      *cluster_ip = Str(val);
    } else if (key == "clusterIPs") {
      s->cluster_ips = StrList(val);
    } else if (key == "externalIPs") {
      s->external_ips = StrList(val);
    } else if (key == "ports") {
      ForElements(val, [&](od::value& pv) {
        ServicePort p;
        ForFields(pv, [&](std::string_view k, od::value& x) {
          if (k == "name") {
            p.name = Str(x);
          } else if (k == "protocol") {
            p.protocol = ParseProtocol(Str(x));
          } else if (k == "port") {
            p.port = Int32(x);
          } else if (k == "nodePort") {
            p.node_port = Int32(x);
          } else if (k == "targetPort") {
            json_type t = x.type();
            if (t == json_type::string) {
              p.target_port.is_name = true;
              p.target_port.name = Str(x);
            } else if (t == json_type::number) {
              p.target_port.number = Int32(x);
            }
          }
        });
        s->ports.push_back(std::move(p));
      });
    } else if (key == "selector") {
      s->selector = StrMap(val);
    } else if (key == "sessionAffinity") {
      s->session_affinity_client_ip = Str(val) == "ClientIP";
    } else if (key == "sessionAffinityConfig") {
      ForFields(val, [&](std::string_view k, od::value& x) {
        if (k != "clientIP") return;
        ForFields(x, [&](std::string_view k2, od::value& y) {
          if (k2 == "timeoutSeconds") s->session_affinity_timeout_seconds = Int32(y);
        });
      });
    } else if (key == "externalTrafficPolicy") {
      s->external_traffic_policy = Str(val);
    } else if (key == "internalTrafficPolicy") {
      s->internal_traffic_policy = Str(val);
    } else if (key == "healthCheckNodePort") {
      s->health_check_node_port = Int32(val);
    } else if (key == "loadBalancerSourceRanges") {
      for (std::string& r : StrList(val)) {
        std::string trimmed(absl::StripAsciiWhitespace(r));
        if (!trimmed.empty()) s->load_balancer_source_ranges.push_back(std::move(trimmed));
      }
    }
  });
}

void DecodeServiceStatus(od::value v, Service* s) {
  ForFields(v, [&](std::string_view key, od::value& val) {
    if (key != "loadBalancer") return;
    ForFields(val, [&](std::string_view k, od::value& x) {
      if (k != "ingress") return;
      ForElements(x, [&](od::value& ing) {
        std::string ip, mode;
        ForFields(ing, [&](std::string_view k2, od::value& y) {
          if (k2 == "ip") {
            ip = Str(y);
          } else if (k2 == "ipMode") {
            mode = Str(y);
          }
        });
        // ipMode Proxy: traffic arrives through the load balancer; never short-circuit the VIP.
        if (!ip.empty() && (mode.empty() || mode == "VIP")) {
          s->load_balancer_ingress_ips.push_back(std::move(ip));
        }
      });
    });
  });
}

void DecodeObject(od::object root, Service* s) {
  std::string cluster_ip;
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key == "metadata") {
      DecodeMeta(val, &s->meta);
    } else if (key == "spec") {
      DecodeServiceSpec(val, s, &cluster_ip);
    } else if (key == "status") {
      DecodeServiceStatus(val, s);
    }
  });
  if (cluster_ip == "None") {
    s->headless = true;
    s->cluster_ips.clear();
  } else if (s->cluster_ips.empty() && !cluster_ip.empty()) {
    s->cluster_ips.push_back(cluster_ip);
  }
  s->meta.labels = {};  // validated, not kept (the agent selects Services by the apiserver)
  if (s->session_affinity_client_ip && s->session_affinity_timeout_seconds == 0) {
    s->session_affinity_timeout_seconds = 10800;
  }
}

void DecodeObject(od::object root, EndpointSlice* es) {
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key == "metadata") {
      DecodeMeta(val, &es->meta);
    } else if (key == "addressType") {
      es->address_type = Str(val);
    } else if (key == "endpoints") {
      ForElements(val, [&](od::value& ev) {
        Endpoint e;
        ForFields(ev, [&](std::string_view k, od::value& x) {
          if (k == "addresses") {
            bool first = true;
            ForElements(x, [&](od::value& a) {
              std::string addr = Str(a);  // every one validated, the first kept
              if (first) e.address = std::move(addr);
              first = false;
            });
          } else if (k == "conditions") {
            ForFields(x, [&](std::string_view c, od::value& y) {
              if (IsNull(y)) return;  // nil keeps the API default
              if (c == "ready") {
                e.ready = Bool(y);
              } else if (c == "serving") {
                e.serving = Bool(y);
              } else if (c == "terminating") {
                e.terminating = Bool(y);
              }
            });
          } else if (k == "nodeName") {
            e.node_name = Str(x);
          } else if (k == "zone") {
            Str(x);  // validated, not kept
          } else if (k == "targetRef") {
            ForFields(x, [&](std::string_view r, od::value& y) {
              if (r == "kind" || r == "name") Str(y);  // validated, not kept
            });
          }
        });
        es->endpoints.push_back(std::move(e));
      });
    } else if (key == "ports") {
      ForElements(val, [&](od::value& pv) {
        EndpointPort p;
        ForFields(pv, [&](std::string_view k, od::value& x) {
          if (k == "name") {
            p.name = Str(x);
          } else if (k == "protocol") {
            p.protocol = ParseProtocol(Str(x));
          } else if (k == "port") {
            if (!IsNull(x)) p.port = Int32(x);
          }
        });
        es->ports.push_back(std::move(p));
      });
    }
  });
  auto it = es->meta.labels.find(std::string(kLabelServiceName));
  if (it != es->meta.labels.end()) es->service_name = std::move(it->second);
  es->meta.labels = {};
  es->endpoints.shrink_to_fit();
}

void DecodeObject(od::object root, Pod* p) {
  std::string pod_ip;
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key == "metadata") {
      DecodeMeta(val, &p->meta);
    } else if (key == "spec") {
      ForFields(val, [&](std::string_view k, od::value& x) {
        if (k == "nodeName") {
          p->node_name = Str(x);
        } else if (k == "hostNetwork") {
          p->host_network = Bool(x);
        } else if (k == "containers") {
          ForElements(x, [&](od::value& c) {
            ForFields(c, [&](std::string_view ck, od::value& y) {
              if (ck != "ports") return;
              ForElements(y, [&](od::value& pv) {
                ContainerPort cp;
                ForFields(pv, [&](std::string_view pk, od::value& z) {
                  if (pk == "name") {
                    cp.name = Str(z);
                  } else if (pk == "containerPort") {
                    cp.port = Int32(z);
                  } else if (pk == "protocol") {
                    cp.protocol = ParseProtocol(Str(z));
                  }
                });
                p->container_ports.push_back(std::move(cp));
              });
            });
          });
        }
      });
    } else if (key == "status") {
      ForFields(val, [&](std::string_view k, od::value& x) {
        if (k == "phase") {
          p->phase = Str(x);
        } else if (k == "podIP") {
          pod_ip = Str(x);
        } else if (k == "hostIP") {
          p->host_ip = Str(x);
        } else if (k == "podIPs") {
          ForElements(x, [&](od::value& ipv) {
            ForFields(ipv, [&](std::string_view ik, od::value& y) {
              if (ik == "ip") p->pod_ips.push_back(Str(y));
            });
          });
        } else if (k == "conditions") {
          p->ready = ConditionTrue(x, "Ready");
        }
      });
    }
  });
  if (p->pod_ips.empty() && !pod_ip.empty()) p->pod_ips.push_back(std::move(pod_ip));
}

void DecodeObject(od::object root, Namespace* ns) {
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key == "metadata") DecodeMeta(val, &ns->meta);
  });
}

void DecodeObject(od::object root, Node* n) {
  std::string pod_cidr;
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key == "metadata") {
      DecodeMeta(val, &n->meta);
    } else if (key == "spec") {
      ForFields(val, [&](std::string_view k, od::value& x) {
        if (k == "podCIDR") {
          pod_cidr = Str(x);
        } else if (k == "podCIDRs") {
          n->pod_cidrs = StrList(x);
        }
      });
    } else if (key == "status") {
      ForFields(val, [&](std::string_view k, od::value& x) {
        if (k == "addresses") {
          ForElements(x, [&](od::value& av) {
            std::string type, addr;
            ForFields(av, [&](std::string_view ak, od::value& y) {
              if (ak == "type") {
                type = Str(y);
              } else if (ak == "address") {
                addr = Str(y);
              }
            });
            if (type == "InternalIP") n->internal_ips.push_back(std::move(addr));
          });
        } else if (k == "conditions") {
          n->ready = ConditionTrue(x, "Ready");
        }
      });
    }
  });
  if (n->pod_cidrs.empty() && !pod_cidr.empty()) n->pod_cidrs.push_back(std::move(pod_cidr));
}

std::string Minify(std::string_view raw) {
  std::string out(raw.size(), '\0');
  size_t len = 0;
  if (simdjson::minify(raw.data(), raw.size(), out.data(), len) != simdjson::SUCCESS) {
    throw simdjson::simdjson_error(simdjson::TAPE_ERROR);
  }
  out.resize(len);
  return out;
}

// ---- NetworkPolicy spec, typed ----------------------------------------------------------
// A NetworkPolicy that fails to decode would vanish from the store and open what it denies, so
// the typed spec is decoded leniently: a field of the wrong JSON type marks the selector, rule or
// spec it belongs to as bad (kept in `error`), and the translator rejects that part, failing
// closed. Values that are not read are skipped by On-Demand.

bool IsType(od::value& v, json_type t) { return v.type() == t; }

// A string, or null (""); anything else leaves *out unchanged and returns false.
bool LenientStr(od::value& v, std::string* out) {
  json_type t = v.type();
  if (t == json_type::null) {
    out->clear();
    return true;
  }
  if (t != json_type::string) return false;
  std::string_view sv;
  if (v.get_string().get(sv) != simdjson::SUCCESS) return false;
  *out = std::string(sv);
  return true;
}

bool LenientInt64(od::value& v, int64_t* out) {
  if (!IsType(v, json_type::number)) return false;
  return v.get_int64().get(*out) == simdjson::SUCCESS;
}

bool LenientStrList(od::value& v, std::vector<std::string>* out) {
  if (IsNull(v)) return true;
  if (!IsType(v, json_type::array)) return false;
  bool ok = true;
  for (auto el : v.get_array()) {
    od::value x = el.value();
    std::string s;
    if (!LenientStr(x, &s)) {
      ok = false;
      continue;
    }
    out->push_back(std::move(s));
  }
  return ok;
}

LabelSelector DecodeLabelSelector(od::value& v) {
  LabelSelector sel;
  if (IsNull(v)) return sel;
  if (!IsType(v, json_type::object)) {
    sel.error = "selector is not an object";
    return sel;
  }
  ForFields(v, [&](std::string_view key, od::value& val) {
    if (key == "matchLabels") {
      if (IsNull(val)) return;
      if (!IsType(val, json_type::object)) {
        sel.error = "matchLabels is not an object";
        return;
      }
      ForFields(val, [&](std::string_view k, od::value& x) {
        std::string value;
        if (!LenientStr(x, &value)) {
          sel.error = absl::StrCat("matchLabels[", std::string(k), "] is not a string");
          return;
        }
        sel.match_labels[std::string(k)] = std::move(value);
      });
    } else if (key == "matchExpressions") {
      if (IsNull(val)) return;
      if (!IsType(val, json_type::array)) {
        sel.error = "matchExpressions is not a list";
        return;
      }
      ForElements(val, [&](od::value& ev) {
        LabelSelectorRequirement req;
        if (!IsType(ev, json_type::object)) {
          sel.error = "a matchExpression is not an object";
          return;
        }
        ForFields(ev, [&](std::string_view k, od::value& x) {
          bool ok = true;
          if (k == "key") {
            ok = LenientStr(x, &req.key);
          } else if (k == "operator") {
            ok = LenientStr(x, &req.op);
          } else if (k == "values") {
            ok = LenientStrList(x, &req.values);
          }
          if (!ok) sel.error = absl::StrCat("matchExpressions[].", std::string(k), " has the wrong type");
        });
        sel.match_expressions.push_back(std::move(req));
      });
    }
  });
  return sel;
}

void DecodePolicyPeer(od::value& v, NetworkPolicyRule* rule) {
  NetworkPolicyPeer peer;
  if (!IsType(v, json_type::object)) {
    rule->error = "a peer is not an object";
    return;
  }
  ForFields(v, [&](std::string_view key, od::value& val) {
    if (IsNull(val)) return;
    if (key == "podSelector") {
      peer.pod_selector = DecodeLabelSelector(val);
    } else if (key == "namespaceSelector") {
      peer.namespace_selector = DecodeLabelSelector(val);
    } else if (key == "ipBlock") {
      IpBlock block;
      if (!IsType(val, json_type::object)) {
        rule->error = "ipBlock is not an object";
        return;
      }
      ForFields(val, [&](std::string_view k, od::value& x) {
        bool ok = true;
        if (k == "cidr") {
          ok = LenientStr(x, &block.cidr);
        } else if (k == "except") {
          ok = LenientStrList(x, &block.except);
        }
        if (!ok) rule->error = absl::StrCat("ipBlock.", std::string(k), " has the wrong type");
      });
      peer.ip_block = std::move(block);
    }
  });
  rule->peers.push_back(std::move(peer));
}

void DecodePolicyPort(od::value& v, NetworkPolicyRule* rule) {
  NetworkPolicyPort port;
  if (!IsType(v, json_type::object)) {
    rule->error = "a port is not an object";
    return;
  }
  ForFields(v, [&](std::string_view key, od::value& val) {
    if (IsNull(val)) return;
    if (key == "protocol") {
      if (!LenientStr(val, &port.protocol)) rule->error = "ports[].protocol is not a string";
    } else if (key == "port") {
      IntOrString p;
      int64_t n = 0;
      if (IsType(val, json_type::string)) {
        p.is_name = true;
        LenientStr(val, &p.name);
      } else if (LenientInt64(val, &n) && n >= INT32_MIN && n <= INT32_MAX) {
        p.number = static_cast<int32_t>(n);
      } else {
        rule->error = "ports[].port is neither an integer nor a name";
        return;
      }
      port.port = std::move(p);
    } else if (key == "endPort") {
      int64_t n = 0;
      if (!LenientInt64(val, &n)) {
        rule->error = "ports[].endPort is not an integer";
        return;
      }
      port.end_port = n;
    }
  });
  rule->ports.push_back(std::move(port));
}

// ingress[] ({from, ports}) or egress[] ({to, ports}).
void DecodePolicyRules(od::value& v, std::string_view peers_key,
                       std::vector<NetworkPolicyRule>* rules, std::string* spec_error) {
  if (IsNull(v)) return;
  if (!IsType(v, json_type::array)) {
    *spec_error = absl::StrCat(peers_key == "from" ? "ingress" : "egress", " is not a list");
    return;
  }
  ForElements(v, [&](od::value& rv) {
    NetworkPolicyRule rule;
    if (!IsType(rv, json_type::object)) {
      rule.error = "rule is not an object";
    } else {
      ForFields(rv, [&](std::string_view key, od::value& val) {
        if (IsNull(val)) return;
        if (key != peers_key && key != "ports") return;
        if (!IsType(val, json_type::array)) {
          rule.error = absl::StrCat(std::string(key), " is not a list");
          return;
        }
        const bool is_ports = key == "ports";
        ForElements(val, [&](od::value& item) {
          if (is_ports) {
            DecodePolicyPort(item, &rule);
          } else {
            DecodePolicyPeer(item, &rule);
          }
        });
      });
    }
    rules->push_back(std::move(rule));
  });
}

void DecodeNetworkPolicySpec(std::string_view json, NetworkPolicySpec* spec) {
  // The spec was taken whole (raw_json) for spec_json; it is read a second time, typed, with a
  // parser of its own (a policy spec is small).
  thread_local od::parser parser;
  simdjson::padded_string padded(json);
  try {
    od::document doc = parser.iterate(padded);
    od::object root = doc.get_object();
    ForFields(root, [&](std::string_view key, od::value& val) {
      if (key == "podSelector") {
        spec->pod_selector = DecodeLabelSelector(val);
      } else if (key == "policyTypes") {
        if (!LenientStrList(val, &spec->policy_types)) {
          spec->error = "policyTypes is not a list of strings";
        }
      } else if (key == "ingress") {
        DecodePolicyRules(val, "from", &spec->ingress, &spec->error);
      } else if (key == "egress") {
        DecodePolicyRules(val, "to", &spec->egress, &spec->error);
      }
    });
  } catch (const simdjson::simdjson_error& e) {
    *spec = NetworkPolicySpec{};
    spec->error = absl::StrCat("spec: ", e.what());
  }
}

void DecodeObject(od::object root, NetworkPolicy* np) {
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key == "metadata") {
      DecodeMeta(val, &np->meta);
    } else if (key == "spec") {
      od::object spec = val.get_object();
      np->spec_json = Minify(std::string_view(spec.raw_json()));
      DecodeNetworkPolicySpec(np->spec_json, &np->spec);
    }
  });
}

void DecodeObject(od::object root, ApiStatus* st) {
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key == "code") {
      st->code = Int32(val);
    } else if (key == "status") {
      st->status = Str(val);
    } else if (key == "reason") {
      st->reason = Str(val);
    } else if (key == "message") {
      st->message = Str(val);
    } else if (key == "details") {
      ForFields(val, [&](std::string_view k, od::value& x) {
        if (k == "retryAfterSeconds") {
          st->retry_after_seconds = Int32(x);
        } else if (k == "causes") {
          ForElements(x, [&](od::value& c) {
            ForFields(c, [&](std::string_view ck, od::value& y) {
              if (ck == "reason") st->cause_reasons.push_back(Str(y));
            });
          });
        }
      });
    }
  });
}

void DecodeObject(od::object root, ListMeta* lm) {
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key == "resourceVersion") {
      lm->resource_version = Str(val);
    } else if (key == "continue") {
      lm->continue_token = Str(val);
    } else if (key == "remainingItemCount") {
      lm->remaining_item_count = IsNull(val) ? -1 : int64_t(val.get_int64());
    }
  });
}

EventType ParseEventType(std::string_view s) {
  if (s == "ADDED") return EventType::kAdded;
  if (s == "MODIFIED") return EventType::kModified;
  if (s == "DELETED") return EventType::kDeleted;
  if (s == "BOOKMARK") return EventType::kBookmark;
  if (s == "ERROR") return EventType::kError;
  return EventType::kUnknown;
}

void DecodeObject(od::object root, RawEvent* ev) {
  bool have_object = false;
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key == "type") {
      ev->type_name = Str(val);
      ev->type = ParseEventType(ev->type_name);
    } else if (key == "object") {
      od::object obj = val.get_object();
      ev->object_json = std::string(std::string_view(obj.raw_json()));
      have_object = true;
    }
  });
  if (ev->type_name.empty() || !have_object) {
    throw simdjson::simdjson_error(simdjson::NO_SUCH_FIELD);
  }
}

struct ResourceVersionOnly {
  std::string rv;
};

void DecodeObject(od::object root, ResourceVersionOnly* out) {
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key != "metadata") return;
    ForFields(val, [&](std::string_view k, od::value& x) {
      if (k == "resourceVersion") out->rv = Str(x);
    });
  });
}

void DecodeObject(od::object root, ObjectMeta* out) {
  ForFields(root, [&](std::string_view key, od::value& val) {
    if (key != "metadata") return;
    ForFields(val, [&](std::string_view k, od::value& x) {
      if (x.type() != json_type::string) return;  // identity fields are strings; skip the rest
      if (k == "name") {
        out->name = Str(x);
      } else if (k == "namespace") {
        out->namespace_ = Str(x);
      } else if (k == "uid") {
        out->uid = Str(x);
      } else if (k == "resourceVersion") {
        out->resource_version = Str(x);
      }
    });
  });
  if (out->name.empty()) throw simdjson::simdjson_error(simdjson::NO_SUCH_FIELD);
}

}  // namespace

std::string_view EventTypeName(EventType t) {
  switch (t) {
    case EventType::kAdded:
      return "ADDED";
    case EventType::kModified:
      return "MODIFIED";
    case EventType::kDeleted:
      return "DELETED";
    case EventType::kBookmark:
      return "BOOKMARK";
    case EventType::kError:
      return "ERROR";
    case EventType::kUnknown:
      break;
  }
  return "UNKNOWN";
}

struct Decoder::Parser {
  od::parser parser;
  std::string padded;
};

Decoder::Decoder() : parser_(std::make_unique<Parser>()) {}
Decoder::~Decoder() = default;

template <typename Fn>
absl::Status Decoder::Run(std::string_view json, std::string_view what, Fn&& fn) {
  std::string& padded = parser_->padded;
  padded.resize(json.size() + simdjson::SIMDJSON_PADDING);
  std::memcpy(padded.data(), json.data(), json.size());
  std::memset(padded.data() + json.size(), 0, simdjson::SIMDJSON_PADDING);
  try {
    od::document doc = parser_->parser.iterate(padded.data(), json.size(), padded.size());
    od::object root = doc.get_object();
    fn(root);
  } catch (const simdjson::simdjson_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("decode ", std::string(what), ": ", e.what()));
  }
  return absl::OkStatus();
}

#define SLUICE_DECODER_DECODE(Type, Name)                                         \
  absl::Status Decoder::Decode(std::string_view json, Type* out) {                \
    *out = Type{};                                                                \
    return Run(json, Name, [&](od::object root) { DecodeObject(root, out); });   \
  }

SLUICE_DECODER_DECODE(Service, "Service")
SLUICE_DECODER_DECODE(EndpointSlice, "EndpointSlice")
SLUICE_DECODER_DECODE(Pod, "Pod")
SLUICE_DECODER_DECODE(Namespace, "Namespace")
SLUICE_DECODER_DECODE(Node, "Node")
SLUICE_DECODER_DECODE(NetworkPolicy, "NetworkPolicy")
SLUICE_DECODER_DECODE(ApiStatus, "Status")
SLUICE_DECODER_DECODE(ListMeta, "list metadata")
SLUICE_DECODER_DECODE(RawEvent, "watch event")

#undef SLUICE_DECODER_DECODE

absl::Status Decoder::DecodeResourceVersion(std::string_view json, std::string* rv) {
  ResourceVersionOnly out;
  absl::Status st = Run(json, "object metadata",
                        [&](od::object root) { DecodeObject(root, &out); });
  *rv = std::move(out.rv);
  return st;
}

absl::Status Decoder::DecodeIdentity(std::string_view json, ObjectMeta* out) {
  *out = ObjectMeta{};
  return Run(json, "object identity", [&](od::object root) { DecodeObject(root, out); });
}

}  // namespace sluice::k8s
