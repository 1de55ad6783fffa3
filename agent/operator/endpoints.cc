#include "agent/operator/endpoints.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace sluice::agent {

std::vector<metrics::Route> OperatorHealthRoutes(const Operator& op) {
  auto healthz = [&op] {
    if (op.election_ended())
      return metrics::HttpReply{.status = 503, .body = "fail election: ended\n"};
    return metrics::HttpReply{.body = "ok election\n"};
  };
  auto readyz = [&op] {
    if (op.election_ended())
      return metrics::HttpReply{.status = 503, .body = "fail election: ended\n"};
    if (!op.leading()) return metrics::HttpReply{.body = "ok election: following\n"};
    if (std::string err = op.last_error(); !err.empty()) {
      return metrics::HttpReply{
          .status = 503,
          .body = absl::StrCat("ok election: leading\nfail allocation: ", err, "\n")};
    }
    return metrics::HttpReply{.body = "ok election: leading\nok allocation\n"};
  };
  return {{"/healthz", healthz}, {"/readyz", readyz}};
}

void AddOperatorCollector(const Operator& op, metrics::Registry& registry) {
  registry.AddCollector([&op](metrics::ScrapeSink& sink) {
    const bool leading = op.leading();
    sink.Gauge("sluice_operator_leader", "1 while this replica holds the Lease and allocates", {},
               leading ? 1 : 0);
    const OperatorCounters c = op.counters();
    sink.Counter("sluice_operator_allocation_rounds_total",
                 "allocation rounds this replica ran while leading", {}, c.rounds);
    sink.Counter("sluice_operator_node_cidrs_allocated_total", "Nodes this replica gave a pod CIDR",
                 {}, c.patched);
    sink.Counter("sluice_operator_patch_conflicts_total",
                 "Node patches refused with 409 (the Node changed since the list; redone)", {},
                 c.patch_conflicts);
    sink.Counter("sluice_operator_errors_total", "failed Node lists and patches", {},
                 c.patch_errors);
    // What the last round saw: a follower has not looked, so it says nothing.
    if (!leading) return;
    sink.Gauge("sluice_operator_nodes_without_cidr",
               "Nodes the last round left without a pod CIDR: the cluster pool is exhausted", {},
               c.exhausted_nodes);
    sink.Gauge("sluice_operator_foreign_nodes",
               "Nodes whose spec.podCIDR is outside the cluster pool", {}, c.foreign_nodes);
    sink.Gauge("sluice_operator_free_node_cidrs", "node CIDRs of the pool still free", {},
               c.free_cidrs);
  });
}

}  // namespace sluice::agent
