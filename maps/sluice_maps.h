// The whole map ABI for C++ callers: the name constants and key/value types of every map (from
// the one list in maps/map_list.h), typed aliases, and the pin paths under a bpffs root.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "maps/map.h"
#include "maps/map_list.h"
#include "maps/slot_array.h"

namespace sluice::maps {

// maps::spec::<name>: one struct per map with its pinned name, key, value, type and size.
#define SLUICE_CXX_MAP_SPEC(name_, type_, key_, value_, max_entries_, map_flags_) \
  struct name_ {                                                                 \
    static constexpr const char kName[] = #name_;                                \
    using Key = key_;                                                            \
    using Value = value_;                                                        \
    static constexpr uint32_t kType = type_;                                     \
    static constexpr uint32_t kMaxEntries = max_entries_;                        \
    static constexpr uint32_t kMapFlags = map_flags_;                            \
  };
// A map of maps: Value is the inner maps' value (the outer map's own is an fd or id).
#define SLUICE_CXX_MAP_OF_MAPS_SPEC(name_, type_, key_, inner_type_, inner_value_, max_entries_, \
                                    inner_flags_)                                              \
  struct name_ {                                                                               \
    static constexpr const char kName[] = #name_;                                              \
    using Key = key_;                                                                          \
    using Value = inner_value_;                                                                \
    static constexpr uint32_t kType = type_;                                                   \
    static constexpr uint32_t kInnerType = inner_type_;                                        \
    static constexpr uint32_t kMaxEntries = max_entries_;                                      \
    static constexpr uint32_t kInnerMapFlags = inner_flags_;                                   \
  };
namespace spec {
SLUICE_MAPS(SLUICE_CXX_MAP_SPEC)
SLUICE_MAPS_OF_MAPS(SLUICE_CXX_MAP_OF_MAPS_SPEC)
}  // namespace spec
#undef SLUICE_CXX_MAP_SPEC
#undef SLUICE_CXX_MAP_OF_MAPS_SPEC

// maps::name::<name>: the map's name, which is also its pin under the bpffs root. Spelled as in
// BPF, bpftool and the docs.
#define SLUICE_CXX_MAP_NAME(name_, ...) inline constexpr const char* name_ = spec::name_::kName;
namespace name {
SLUICE_MAPS(SLUICE_CXX_MAP_NAME)
SLUICE_MAPS_OF_MAPS(SLUICE_CXX_MAP_NAME)
}  // namespace name
#undef SLUICE_CXX_MAP_NAME

// Every map's name, in list order.
#define SLUICE_CXX_MAP_NAME_ENTRY(name_, ...) spec::name_::kName,
inline constexpr const char* kAllMapNames[] = {SLUICE_MAPS(SLUICE_CXX_MAP_NAME_ENTRY)
                                                   SLUICE_MAPS_OF_MAPS(SLUICE_CXX_MAP_NAME_ENTRY)};
#undef SLUICE_CXX_MAP_NAME_ENTRY
inline constexpr size_t kMapCount = std::size(kAllMapNames);

// The typed wrapper of a map, from its spec. An mmapable array is a table of slots, free when
// zero (maps/slot_array.h).
template <typename Spec>
using MapOf = std::conditional_t<
    Spec::kType == BPF_MAP_TYPE_PERCPU_ARRAY || Spec::kType == BPF_MAP_TYPE_PERCPU_HASH ||
        Spec::kType == BPF_MAP_TYPE_LRU_PERCPU_HASH,
    PerCpuMap<typename Spec::Key, typename Spec::Value>,
    std::conditional_t<IsSlotArray(Spec::kType, Spec::kMapFlags), SlotArray<typename Spec::Value>,
                       Map<typename Spec::Key, typename Spec::Value>>>;

using EndpointMap = MapOf<spec::sluice_ep4>;
using Ep4SlotMap = MapOf<spec::sluice_ep4_slot>;  // sluice_ep4's index (a slot array)
using Ep4RecordMap = MapOf<spec::sluice_ep4_rec>;
using NodeConfigMap = MapOf<spec::sluice_node>;
using NoMasqMap = MapOf<spec::sluice_nomasq4>;
using NatMap = MapOf<spec::sluice_snat4>;  // sluice_snat4 and sluice_rnat4 (masquerade)
using DropMap = MapOf<spec::sluice_drops>;
using ForwardMap = MapOf<spec::sluice_forward>;
using Lb4ServiceMap = MapOf<spec::sluice_lb4_svc>;
using Lb4BackendMap = MapOf<spec::sluice_lb4_be>;
using Lb4SlotRecordMap = MapOf<spec::sluice_lb4_rec>;
using Lb4RevNatMap = MapOf<spec::sluice_lb4_rnat>;
using Ct4Map = MapOf<spec::sluice_ct4>;  // sluice_ct4 (TCP) and sluice_ct4_any
using CtStatsMap = MapOf<spec::sluice_ct_stats>;
using CtPairsMap = MapOf<spec::sluice_ct_pairs>;
using Frag4Map = MapOf<spec::sluice_frag4>;
using Lb4SourceRangeMap = MapOf<spec::sluice_lb4_srcr>;
using Lb4AffinityMap = MapOf<spec::sluice_lb4_aff>;
using Lb4NonBackendPortMap = MapOf<spec::sluice_lb4_nbport>;
using SockConfigMap = MapOf<spec::sluice_sock_cfg>;
using Sock4RevNatMap = MapOf<spec::sluice_sock4_rnat>;
using PolicyDropMap = MapOf<spec::sluice_pol_drops>;
using Tunnel4Map = MapOf<spec::sluice_tunnel4>;
using MonitorConfigMap = MapOf<spec::sluice_monitor>;
using MonitorCpuMap = MapOf<spec::sluice_mon_cpu>;
// sluice_events is a ring buffer: read with libbpf's ring_buffer (agent/monitor/), never as a
// Map. Its key and value are empty, as the kernel requires.
static_assert(spec::sluice_events::kType == BPF_MAP_TYPE_RINGBUF);
static_assert(std::is_same_v<NatMap, MapOf<spec::sluice_rnat4>>);
static_assert(std::is_same_v<Ct4Map, MapOf<spec::sluice_ct4_any>>);
// maps/policy.h names the policy maps' wrappers; they are the listed maps'.
static_assert(std::is_same_v<Ipcache4Map, MapOf<spec::sluice_ipcache4>>);
static_assert(std::is_same_v<Policy4Map, MapOf<spec::sluice_policy4>>);
static_assert(std::is_same_v<PolicyEndpointMap, MapOf<spec::sluice_policy_ep>>);
// The wrappers keep the types callers were written against.
static_assert(std::is_same_v<EndpointMap, Map<sluice_ep4_key, sluice_endpoint>>);
static_assert(std::is_same_v<Ep4SlotMap, SlotArray<sluice_ep4_ref>>);
static_assert(std::is_same_v<NodeConfigMap, Map<__u32, sluice_node_config>>);
static_assert(std::is_same_v<DropMap, PerCpuMap<__u32, sluice_drop_count>>);
static_assert(std::is_same_v<Lb4RevNatMap, Map<__u32, sluice_lb4_revnat>>);

inline std::string PinPath(const std::string& root, const char* map_name) {
  return root + "/" + map_name;
}

}  // namespace sluice::maps
