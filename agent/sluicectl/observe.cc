// sluicectl observe: flows from the agent's flow monitor (agent/monitor/), as `hubble observe`
// shows them: the last N, then live with --follow; filters; a table or JSON lines. Its options
// are its own (parsed here, spelled as hubble spells them), after the word `observe`.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/monitor/filter.h"
#include "agent/monitor/flow.h"
#include "agent/monitor/observe_client.h"
#include "agent/monitor/observe_server.h"
#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {
namespace {

constexpr char kObserveUsage[] =
    "usage: sluicectl observe [--last N] [--follow|-f] [--pod [NS/]NAME] [--namespace NS]\n"
    "                         [--ip ADDR|CIDR] [--port N] [--protocol tcp|udp|icmp|sctp]\n"
    "                         [--verdict forwarded|dropped] [--drop-reason REASON]\n"
    "                         [--service [NS/]NAME] [--type drop|policy|translate|close]\n"
    "                         [-o table|json] [--socket PATH]\n"
    "                         [--nodes HOST:PORT,... --token-file FILE]\n"
    "Options given more than once match any of their values; different options must all match.\n"
    "A pod, namespace, IP or port matches the source, the destination or a Service's backend.\n"
    "Without --last or --follow: the last 20 flows. Flows come from the agent's memory\n"
    "(--monitor_history) and, while observed, live from the datapath (docs/observe.md).\n"
    "--nodes: every listed node's agent through its relay (--relay_address), merged: the\n"
    "last N of all of them by time, then each node's live flows as they come.\n";

struct ObserveArgs {
  monitor::FlowFilter filter;
  int64_t last = -1;
  bool follow = false;
  std::string output;              // -o after the word; default: sluicectl's own -o (before it)
  std::string socket;              // --socket; default: the agent's --observe_socket (common.h)
  std::vector<std::string> nodes;  // --nodes: relays instead of the local socket
  std::string token_file;
};

int UsageError(const std::string& msg) {
  std::fprintf(stderr, "sluicectl observe: %s\n%s", msg.c_str(), kObserveUsage);
  return 2;
}

// Parses args into *out; returns -1 to go on, else the exit code.
int ParseArgs(const std::vector<std::string>& args, ObserveArgs* out) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); name.rfind("-", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name == "--help" || name == "-h") {
      std::fputs(kObserveUsage, stdout);
      return 0;
    }
    if (name == "--follow" || name == "-f") {
      out->follow = true;
      continue;
    }
    if (name.rfind("-", 0) != 0) return UsageError(absl::StrCat("unexpected argument ", name));
    if (!has_value) {
      if (i + 1 >= args.size()) return UsageError(absl::StrCat(name, " needs a value"));
      value = args[++i];
    }
    auto& f = out->filter;
    if (name == "--last") {
      if (!absl::SimpleAtoi(value, &out->last) || out->last < 0)
        return UsageError(absl::StrCat("--last ", value, ": want a number"));
    } else if (name == "--pod") {
      f.pods.push_back(value);
    } else if (name == "--namespace" || name == "-n") {
      f.namespaces.push_back(value);
    } else if (name == "--ip") {
      f.ips.push_back(value);
    } else if (name == "--port") {
      int port = 0;
      if (!absl::SimpleAtoi(value, &port) || port < 1 || port > 65535)
        return UsageError(absl::StrCat("--port ", value, ": want 1-65535"));
      f.ports.push_back(static_cast<uint16_t>(port));
    } else if (name == "--protocol") {
      f.protocols.push_back(value);
    } else if (name == "--verdict") {
      f.verdict = value;
    } else if (name == "--drop-reason") {
      f.drop_reasons.push_back(value);
    } else if (name == "--service") {
      f.services.push_back(value);
    } else if (name == "--type") {
      f.types.push_back(value);
    } else if (name == "-o" || name == "--output") {
      if (value != "table" && value != "json") return UsageError("-o: want table or json");
      out->output = value;
    } else if (name == "--socket") {
      out->socket = value;
    } else if (name == "--nodes") {
      for (absl::string_view n : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        out->nodes.emplace_back(n);
      }
    } else if (name == "--token-file") {
      out->token_file = value;
    } else {
      return UsageError(absl::StrCat("unknown option ", name));
    }
  }
  if (!out->nodes.empty() && out->token_file.empty()) {
    return UsageError("--nodes needs --token-file (the relays' token)");
  }
  // The agent checks the filter too; checking here names the option as the user spelled it.
  if (auto checked = monitor::FilterFromJson(monitor::FilterToJson(out->filter)); !checked.ok()) {
    return UsageError(std::string(checked.status().message()));
  }
  return -1;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// What happened, in a few words: the drop reason and where, the translation, the verdict.
std::string Summary(const monitor::Flow& f) {
  std::string s;
  if (f.type == "drop") {
    s = absl::StrCat(f.drop_reason, " at ", f.point.empty() ? "?" : f.point, " of ",
                     f.interface.empty() ? absl::StrCat("ifindex ", f.ifindex) : f.interface);
  } else if (f.type == "policy") {
    s = absl::StrCat(f.verdict == "dropped" ? "policy denied" : "policy allowed", " (",
                     f.policy_direction, f.policy_enforced ? "" : ", not enforced", ")");
  } else if (f.type == "translate" || f.type == "close") {
    std::string svc = f.service.empty() ? absl::StrCat("rev_nat ", f.rev_nat_id)
                                        : absl::StrCat(f.service_namespace, "/", f.service);
    s = absl::StrCat(f.type == "translate" ? "service " : "closed: service ", svc, " -> ",
                     monitor::PeerText(f.backend));
  }
  if (f.type != "translate" && f.type != "close" && !f.service.empty()) {
    absl::StrAppend(&s, " (to service ", f.service_namespace, "/", f.service, ")");
  }
  if (!f.tcp_flags.empty())
    absl::StrAppend(&s, " ", f.protocol == "tcp" ? "TCP " : "", f.tcp_flags);
  return s;
}

void PrintRow(const monitor::Flow& f) {
  std::string time = absl::FormatTime("%b %e %H:%M:%E3S", f.time, absl::LocalTimeZone());
  std::printf("%-19s %-12s %-30s %-30s %-9s %-9s %s\n", time.c_str(), f.node.c_str(),
              monitor::PeerText(f.source).c_str(), monitor::PeerText(f.destination).c_str(),
              f.type.c_str(), Upper(f.verdict).c_str(), Summary(f).c_str());
  std::fflush(stdout);
}

// The relays' shared token: the file's first line.
bool ReadTokenFile(const std::string& path, std::string* token) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    std::fprintf(stderr, "sluicectl observe: --token-file %s: %s\n", path.c_str(),
                 std::strerror(errno));
    return false;
  }
  char buf[512] = {};
  const bool read = std::fgets(buf, sizeof(buf), f) != nullptr;
  std::fclose(f);
  *token = read ? buf : "";
  while (!token->empty() && (token->back() == '\n' || token->back() == '\r')) token->pop_back();
  if (token->empty()) {
    std::fprintf(stderr, "sluicectl observe: --token-file %s is empty\n", path.c_str());
    return false;
  }
  return true;
}

// An answer without a flow would look like a command that did nothing: say that nothing matched
// (on stderr, so -o json's stream stays one flow per line).
void NothingMatched(const nlohmann::json& req, size_t printed) {
  if (printed != 0) return;
  if (req["filter"].empty()) {
    std::fprintf(stderr, "sluicectl observe: no flows: the agent's flow monitor holds none yet\n");
  } else {
    std::fprintf(stderr, "sluicectl observe: no flow matches the filters %s\n",
                 req["filter"].dump().c_str());
  }
}

}  // namespace

int Observe(const std::vector<std::string>& args) {
  ObserveArgs a;
  if (int rc = ParseArgs(args, &a); rc >= 0) return rc;
  // `sluicectl -o json observe` means what `sluicectl observe -o json` does.
  if (a.output.empty()) a.output = JsonOutput() ? "json" : "table";
  const bool socket_given = !a.socket.empty();
  if (!socket_given) a.socket = ObserveSocket();
  nlohmann::json req = {{"follow", a.follow}, {"filter", monitor::FilterToJson(a.filter)}};
  if (a.last >= 0) req["last"] = a.last;
  signal(SIGPIPE, SIG_IGN);
  absl::Mutex out_mu;  // one printer for every node's stream
  bool header = false;
  size_t printed = 0;  // guarded by out_mu
  auto print = [&](const nlohmann::json& flow) {
    auto f = monitor::FlowFromJson(flow);
    absl::MutexLock l(&out_mu);
    if (!f.ok()) {
      std::fprintf(stderr, "sluicectl observe: %s\n", std::string(f.status().message()).c_str());
      return;
    }
    ++printed;
    if (a.output == "json") {
      std::printf("%s\n", flow.dump().c_str());
      std::fflush(stdout);
      return;
    }
    if (!header) {
      std::printf("%-19s %-12s %-30s %-30s %-9s %-9s %s\n", "TIME", "NODE", "SOURCE",
                  "DESTINATION", "TYPE", "VERDICT", "SUMMARY");
      header = true;
    }
    PrintRow(*f);
  };
  auto lost = [&](const std::string& where, const nlohmann::json& line, const char* key) {
    uint64_t n = line[key].value("events_lost", uint64_t{0});
    if (n == 0) return;
    absl::MutexLock l(&out_mu);
    std::fprintf(stderr, "EVENTS LOST: %llu so far on %s\n", static_cast<unsigned long long>(n),
                 where.c_str());
  };
  if (a.nodes.empty()) {
    auto st = monitor::Observe(a.socket, req, [&](const nlohmann::json& line) {
      if (line.contains("flow")) print(line["flow"]);
      if (line.contains("status")) lost("this node", line, "status");
      if (line.contains("lost")) lost("this node", line, "lost");
      return true;
    });
    if (!st.ok()) {
      std::fprintf(stderr, "sluicectl observe: %s\n", std::string(st.message()).c_str());
      if (!socket_given && !AgentNotReached().empty()) {
        std::fprintf(stderr, "sluicectl observe: %s\n", AgentNotReached().c_str());
      }
      return 1;
    }
    NothingMatched(req, printed);
    return 0;
  }

  // Every node through its relay: each node's history first, merged by time and cut to the
  // last N of all of them; then (--follow) each node's live flows as they arrive (a relay marks
  // where its history ends with a {"live": {}} line).
  std::string token;
  if (!ReadTokenFile(a.token_file, &token)) return 1;
  const size_t keep = a.last >= 0 ? static_cast<size_t>(a.last) : (a.follow ? 0 : 20);
  std::vector<std::pair<absl::Time, nlohmann::json>> history;  // guarded by out_mu
  absl::BlockingCounter histories(static_cast<int>(a.nodes.size()));
  absl::Notification history_printed;
  std::atomic<int> failed{0};
  std::vector<std::thread> streams;
  for (const std::string& node : a.nodes) {
    streams.emplace_back([&, node] {
      bool live = false;
      auto st = monitor::ObserveRelay(node, token, req, [&](const nlohmann::json& line) {
        if (line.contains("status")) lost(node, line, "status");
        if (line.contains("lost")) lost(node, line, "lost");
        if (line.contains("live") && !live) {
          live = true;
          histories.DecrementCount();
        }
        if (!line.contains("flow")) return true;
        if (live) {
          history_printed.WaitForNotification();
          print(line["flow"]);
          return true;
        }
        auto f = monitor::FlowFromJson(line["flow"]);
        absl::MutexLock l(&out_mu);
        history.emplace_back(f.ok() ? f->time : absl::InfinitePast(), line["flow"]);
        return true;
      });
      if (!st.ok()) {
        failed++;
        absl::MutexLock l(&out_mu);
        std::fprintf(stderr, "sluicectl observe: node %s: %s\n", node.c_str(),
                     std::string(st.message()).c_str());
      }
      if (!live) histories.DecrementCount();
    });
  }
  histories.Wait();
  std::vector<std::pair<absl::Time, nlohmann::json>> merged;
  {
    absl::MutexLock l(&out_mu);
    merged.swap(history);
  }
  std::stable_sort(merged.begin(), merged.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  const size_t from = merged.size() > keep ? merged.size() - keep : 0;
  for (size_t k = from; k < merged.size(); ++k) print(merged[k].second);
  history_printed.Notify();
  for (auto& t : streams) t.join();
  if (failed == 0) NothingMatched(req, printed);
  return failed == 0 ? 0 : 1;
}

}  // namespace sluice::ctl
