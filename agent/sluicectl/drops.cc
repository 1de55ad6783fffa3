// sluicectl drops: per-reason drop counters, summed over CPUs.
#include <arpa/inet.h>

#include "agent/sluicectl/common.h"
#include "loader/datapath.h"

namespace sluice::ctl {

int Drops() {
  const bool json = JsonOutput();
  auto drops = OpenOrDie<maps::DropMap>(maps::name::sluice_drops);
  auto totals = loader::ReadDropTotals(drops);
  if (!totals.ok()) {
    std::fprintf(stderr, "sluicectl: %s\n", std::string(totals.status().message()).c_str());
    return 1;
  }
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& t : *totals) {
      out.push_back(
          {{"id", t.reason}, {"reason", t.name}, {"packets", t.packets}, {"bytes", t.bytes}});
    }
    PrintJson(out);
    return 0;
  }
  std::printf("%-4s %-20s %12s %14s\n", "ID", "REASON", "PACKETS", "BYTES");
  for (const auto& t : *totals) {
    std::printf("%-4u %-20s %12llu %14llu\n", t.reason, t.name,
                static_cast<unsigned long long>(t.packets),
                static_cast<unsigned long long>(t.bytes));
  }
  return 0;
}

}  // namespace sluice::ctl
