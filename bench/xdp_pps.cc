// Packets per second through a NodePort to a backend on another node: sluice_xdp_net (XDP_TX)
// against Sluice's TC path (sluice_from_net, bpf_redirect) and kube-proxy's iptables (legacy) and
// nftables NodePort layouts, on a veth pair in a private network namespace, in the same run. The
// claims are the ratios XDP / TC, XDP / iptables, XDP / nftables, TC / iptables.
//
// How the numbers are made:
// - n0 is the node's native device (address 10.99.0.2, the NodePort's); its peer g0 is the
//   network: the client's packets enter through it and the forwarded ones come back to it (the
//   backend's node 10.99.0.1 is reached through n0, a permanent neighbour with g0's MAC).
// - The generator is BPF_PROG_TEST_RUN in live-frame mode (BPF_F_TEST_XDP_LIVE_FRAMES) on a
//   two-instruction XDP program that redirects every frame into g0: each frame arrives on n0 as
//   from a NIC, a UDP datagram of one established flow (client 10.99.2.7:40000 -> NodePort
//   10.99.0.2:30080, backend 10.99.1.5:8080, so conntrack and NAT hit).
// - XDP: sluice_xdp_net on n0 translates and sends each frame back out of n0 (XDP_TX). TC: n0
//   runs an XDP program that passes everything (a NIC driver building the skb), then
//   sluice_from_net translates and redirects out of n0. Both modes have sluice_from_net and
//   sluice_to_net attached, as the agent does.
// - g0 runs an XDP program that drops everything (a veth takes XDP_TX frames only with an XDP
//   program; dropping keeps the forwarded frames out of the namespace's stack); the frames it saw
//   (veth's rx_queue_0_xdp_packets) are what was forwarded, in every mode. pps = forwarded / wall
//   time of the generator's syscall (generator, forwarding and receiving share the calling CPU:
//   the absolute figures are per CPU of this machine, the ratio is the claim). Before timing, both
//   paths are checked to translate the flow (backend address, node address as source, checksums)
//   through test_run without live frames.
// - The rig's floor in the same rounds: n0 runs a program that sends every frame straight back
//   (XDP_TX, no lookup, no rewrite), so generator and sink cost alone; XDP's figure cannot pass it.
// - iptables / nftables: the kernel's netfilter does the NodePort translation instead of Sluice,
//   in kube-proxy's layouts for the same Service (bench/gen_kube_proxy_rules.py nodeport-iptables,
//   restored with iptables-legacy-restore, and nodeport-nft, loaded with nft -f): n0 runs the
//   XDP_PASS program as in TC, Sluice's TC programs are detached, ip_forward is on and the backend
//   is routed out of n0 as in the other modes. Only the mode's own rules are loaded during its
//   timing. Each mode has its own client port (40001, 40002: its own conntrack entry, made by its
//   own rules) and the flow is an established one for conntrack: before each timing one frame is
//   captured on g0 (backend address, node address as source, checksums) and the backend's reply
//   to the masqueraded port is sent back (and checked to come out de-NATed), so every timed frame
//   is a conntrack ESTABLISHED hit, as for Sluice. All of it lives in this process's private
//   network namespace, gone when it exits (the rules are also removed before it does).
// - Each round runs every mode (rotating the order); the median per mode is printed.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "loader/datapath.h"
#include "support/fixture.h"
#include "support/packet.h"

namespace sluice::bench {
namespace {

using testing::Ip4;
using testing::Packet;

int Fail(const std::string& what) {
  std::fprintf(stderr, "xdp_pps: %s\n", what.c_str());
  return 1;
}

// An XDP program returning `verdict` for every frame.
int ConstantProgram(int verdict, const char* name) {
  const struct bpf_insn prog[] = {
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = verdict},
      {.code = BPF_JMP | BPF_EXIT},
  };
  return bpf_prog_load(BPF_PROG_TYPE_XDP, name, "GPL", prog, 2, nullptr);
}

// The generator: writes the first 44 bytes of `frame` (Ethernet, IPv4 and UDP headers) back into
// the frame and redirects it into `ifindex`. Live-frame test_run recycles its pages with what the
// receiving side wrote into them (the translated headers), so each run starts from the client's
// packet again.
int GeneratorProgram(int ifindex, const testing::Bytes& frame) {
  constexpr int kWords = 11;
  std::vector<struct bpf_insn> p = {
      {.code = BPF_LDX | BPF_MEM | BPF_W, .dst_reg = BPF_REG_2, .src_reg = BPF_REG_1, .off = 0},
      {.code = BPF_LDX | BPF_MEM | BPF_W, .dst_reg = BPF_REG_3, .src_reg = BPF_REG_1, .off = 4},
      {.code = BPF_ALU64 | BPF_MOV | BPF_X, .dst_reg = BPF_REG_4, .src_reg = BPF_REG_2},
      {.code = BPF_ALU64 | BPF_ADD | BPF_K, .dst_reg = BPF_REG_4, .imm = 4 * kWords},
      {.code = BPF_JMP | BPF_JGT | BPF_X,
       .dst_reg = BPF_REG_4,
       .src_reg = BPF_REG_3,
       .off = kWords},
  };
  for (int i = 0; i < kWords; ++i) {
    int32_t word;
    std::memcpy(&word, frame.data() + 4 * i, 4);
    p.push_back({.code = BPF_ST | BPF_MEM | BPF_W,
                 .dst_reg = BPF_REG_2,
                 .off = static_cast<__s16>(4 * i),
                 .imm = word});
  }
  p.push_back({.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_1, .imm = ifindex});
  p.push_back({.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_2, .imm = 0});
  p.push_back({.code = BPF_JMP | BPF_CALL, .imm = BPF_FUNC_redirect});
  p.push_back({.code = BPF_JMP | BPF_EXIT});
  return bpf_prog_load(BPF_PROG_TYPE_XDP, "bench_gen", "GPL", p.data(),
                       static_cast<__u32>(p.size()), nullptr);
}

// The validation sink for the netfilter modes: copies the first kCaptureBytes of each IPv4
// frame into entry 0 of `map_fd` (an array of one kCaptureBytes value) and drops it.
constexpr int kCaptureBytes = 60;
int CaptureProgram(int map_fd) {
  const struct bpf_insn prog[] = {
      {.code = BPF_LDX | BPF_MEM | BPF_W, .dst_reg = BPF_REG_7, .src_reg = BPF_REG_1, .off = 0},
      {.code = BPF_LDX | BPF_MEM | BPF_W, .dst_reg = BPF_REG_3, .src_reg = BPF_REG_1, .off = 4},
      {.code = BPF_ALU64 | BPF_MOV | BPF_X, .dst_reg = BPF_REG_4, .src_reg = BPF_REG_7},
      {.code = BPF_ALU64 | BPF_ADD | BPF_K, .dst_reg = BPF_REG_4, .imm = kCaptureBytes},
      {.code = BPF_JMP | BPF_JGT | BPF_X, .dst_reg = BPF_REG_4, .src_reg = BPF_REG_3, .off = 10},
      {.code = BPF_LDX | BPF_MEM | BPF_H, .dst_reg = BPF_REG_5, .src_reg = BPF_REG_7, .off = 12},
      {.code = BPF_JMP | BPF_JNE | BPF_K, .dst_reg = BPF_REG_5, .off = 8, .imm = htons(0x0800)},
      {.code = BPF_ST | BPF_MEM | BPF_W, .dst_reg = BPF_REG_10, .off = -4, .imm = 0},
      {.code = BPF_LD | BPF_DW | BPF_IMM,
       .dst_reg = BPF_REG_1,
       .src_reg = BPF_PSEUDO_MAP_FD,
       .imm = map_fd},
      {},
      {.code = BPF_ALU64 | BPF_MOV | BPF_X, .dst_reg = BPF_REG_2, .src_reg = BPF_REG_10},
      {.code = BPF_ALU64 | BPF_ADD | BPF_K, .dst_reg = BPF_REG_2, .imm = -4},
      {.code = BPF_ALU64 | BPF_MOV | BPF_X, .dst_reg = BPF_REG_3, .src_reg = BPF_REG_7},
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_4, .imm = BPF_ANY},
      {.code = BPF_JMP | BPF_CALL, .imm = BPF_FUNC_map_update_elem},
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = XDP_DROP},
      {.code = BPF_JMP | BPF_EXIT},
  };
  return bpf_prog_load(BPF_PROG_TYPE_XDP, "bench_capture", "GPL", prog,
                       sizeof(prog) / sizeof(prog[0]), nullptr);
}

// Frames g0's XDP program saw (what reached the network side), from the veth's ethtool stats.
uint64_t ReceivedOnG0() {
  FILE* f = popen("ethtool -S g0", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t n = 0;
  while (fgets(line, sizeof(line), f) != nullptr) {
    unsigned long long v;
    if (std::sscanf(line, " rx_queue_0_xdp_packets: %llu", &v) == 1) n = v;
  }
  pclose(f);
  return n;
}

// Sends `count` copies of `frame` into g0 with live frames; returns the seconds it took.
double Generate(int gen_fd, const testing::Bytes& frame, uint32_t count) {
  struct xdp_md ctx {};
  ctx.data_end = static_cast<__u32>(frame.size());
  LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame.data(),
              .data_size_in = static_cast<__u32>(frame.size()), .ctx_in = &ctx,
              .ctx_size_in = sizeof(ctx), .repeat = static_cast<int>(count),
              .flags = BPF_F_TEST_XDP_LIVE_FRAMES, .batch_size = 64);
  auto start = std::chrono::steady_clock::now();
  if (bpf_prog_test_run_opts(gen_fd, &opts) != 0) return -1;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int Run(uint32_t frames, int rounds) {
  if (unshare(CLONE_NEWNET) != 0) return Fail("unshare");
  for (const char* cmd : {
           "ip link set lo up",
           "sysctl -qw net.ipv4.ip_forward=1",
           "ip link add n0 address 02:b0:00:00:00:02 type veth peer name g0 address "
           "02:b0:00:00:00:01",
           "ip addr add 10.99.0.2/24 dev n0",
           "ip link set n0 up",
           "ip link set g0 up",
           "ip neigh replace 10.99.0.1 lladdr 02:b0:00:00:00:01 dev n0 nud permanent",
           "ip route add 10.99.1.0/24 via 10.99.0.1",
           "ip route add 10.99.2.0/24 via 10.99.0.1",
       }) {
    if (std::system(cmd) != 0) return Fail(cmd);
  }
  const int n0 = static_cast<int>(if_nametoindex("n0"));
  const int g0 = static_cast<int>(if_nametoindex("g0"));

  testing::ScratchBpffs fs;
  auto dp = loader::Datapath::Load(fs.path());
  if (!dp.ok()) return Fail(std::string(dp.status().message()));
  sluice_node_config cfg{};
  cfg.node_ip4 = Ip4("10.99.0.2");
  cfg.pod_cidr4 = Ip4("10.244.0.0");
  cfg.pod_cidr4_len = 24;
  cfg.gateway_ip4 = Ip4("10.244.0.1");
  cfg.flags = SLUICE_NODE_F_MASQUERADE;
  cfg.nat_port_min = 61000;
  cfg.nat_port_max = 65535;
  if (!(*dp)->node_config().Update(0, cfg).ok()) return Fail("node config");
  if (!testing::ProgramService(**dp, "10.99.0.2", 30080, IPPROTO_UDP, 1,
                               {{1, "10.99.1.5", 8080, IPPROTO_UDP}}, SLUICE_SVC_F_NODEPORT)
           .ok()) {
    return Fail("program the NodePort");
  }
  if (!(*dp)->AttachNative(n0).ok()) return Fail("attach TC");

  // The client's datagram to the NodePort from port `sport`.
  auto client_frame = [](uint16_t sport) {
    return Packet::Eth(testing::ParseMac("02:b0:00:00:00:01"),
                       testing::ParseMac("02:b0:00:00:00:02"))
        .IPv4("10.99.2.7", "10.99.0.2")
        .UDP(sport, 30080)
        .Payload(std::string(18, 'x'))  // a 64-byte frame
        .Build();
  };
  const testing::Bytes frame = client_frame(40000);
  const int pass = ConstantProgram(XDP_PASS, "bench_pass");
  const int sink = ConstantProgram(XDP_DROP, "bench_sink");
  const int gen = GeneratorProgram(g0, frame);
  if (pass < 0 || sink < 0 || gen < 0) return Fail("load the pass / sink / generator programs");
  if (bpf_xdp_attach(g0, sink, XDP_FLAGS_DRV_MODE, nullptr) != 0) return Fail("XDP on g0");

  const int bounce = ConstantProgram(XDP_TX, "bench_bounce");
  if (bounce < 0) return Fail("load the bounce program");

  // The netfilter modes (3 iptables, 4 nftables): kube-proxy's rules for the NodePort, written
  // once into files, loaded while the mode runs.
  char rules_dir[] = "/tmp/xdp_pps.XXXXXX";
  if (mkdtemp(rules_dir) == nullptr) return Fail("mkdtemp");
  const std::string dir = rules_dir, ipt_rules = dir + "/iptables", nft_rules = dir + "/nft";
  struct RemoveOnReturn {
    const std::string &dir, &a, &b;
    ~RemoveOnReturn() {
      std::remove(a.c_str());
      std::remove(b.c_str());
      rmdir(dir.c_str());
    }
  } remove_rules{dir, ipt_rules, nft_rules};
  const std::string gen_args =
      " --node-ip 10.99.0.2 --node-port 30080 --proto udp --endpoint 10.99.1.5:8080 > ";
  for (const std::string& cmd :
       {std::string("python3 " XDP_PPS_GEN_RULES " nodeport-iptables") + gen_args + ipt_rules,
        std::string("python3 " XDP_PPS_GEN_RULES " nodeport-nft") + gen_args + nft_rules}) {
    if (std::system(cmd.c_str()) != 0) return Fail(cmd);
  }
  const std::string clear_ipt =
      "iptables-legacy -t nat -F && iptables-legacy -t nat -X && iptables-legacy -t filter -F && "
      "iptables-legacy -t filter -X";
  const std::string clear_nft = "nft 'add table ip kube-proxy; delete table ip kube-proxy'";
  int rules_loaded = 0;  // 0 none, 3 iptables, 4 nftables
  auto load_rules = [&](int mode) -> bool {
    if (rules_loaded == mode) return true;
    if (rules_loaded != 0 &&
        std::system((rules_loaded == 3 ? clear_ipt : clear_nft).c_str()) != 0) {
      return false;
    }
    rules_loaded = 0;
    if (mode == 3 && std::system(("iptables-legacy-restore < " + ipt_rules).c_str()) != 0) {
      return false;
    }
    if (mode == 4 && std::system(("nft -f " + nft_rules).c_str()) != 0) return false;
    rules_loaded = mode == 3 || mode == 4 ? mode : 0;
    return true;
  };
  const uint16_t nf_port[2] = {40001, 40002};
  const testing::Bytes nf_frame[2] = {client_frame(nf_port[0]), client_frame(nf_port[1])};
  const int nf_gen[2] = {GeneratorProgram(g0, nf_frame[0]), GeneratorProgram(g0, nf_frame[1])};
  const int capture_map =
      bpf_map_create(BPF_MAP_TYPE_ARRAY, "bench_capture", 4, kCaptureBytes, 1, nullptr);
  const int capture = capture_map < 0 ? -1 : CaptureProgram(capture_map);
  if (nf_gen[0] < 0 || nf_gen[1] < 0 || capture < 0) {
    return Fail("load the netfilter modes' generators / capture program");
  }
  // Sends one frame through `gen_fd` and returns the IPv4 frame that reached g0 (empty when none
  // within a second).
  auto capture_one = [&](int gen_fd, const testing::Bytes& f) -> testing::Bytes {
    testing::Bytes got(kCaptureBytes, 0);
    const uint32_t key = 0;
    if (bpf_map_update_elem(capture_map, &key, got.data(), BPF_ANY) != 0) return {};
    if (Generate(gen_fd, f, 1) < 0) return {};
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (std::chrono::steady_clock::now() < deadline) {
      if (bpf_map_lookup_elem(capture_map, &key, got.data()) == 0 && got[12] != 0) return got;
      usleep(1000);
    }
    return {};
  };
  // A netfilter mode's check and conntrack set-up: its client frame reaches g0 translated, the
  // backend's reply to the masqueraded port comes back de-NATed (conntrack saw both directions:
  // the flow is ESTABLISHED for the timed frames).
  auto check_netfilter = [&](int mode) -> bool {
    const int i = mode - 3;
    const char* name = mode == 3 ? "iptables" : "nftables";
    if (bpf_xdp_attach(g0, capture, XDP_FLAGS_DRV_MODE, nullptr) != 0) {
      std::fprintf(stderr, "xdp_pps: attach the capture program on g0\n");
      return false;
    }
    bool ok = false;
    testing::Bytes out = capture_one(nf_gen[i], nf_frame[i]);
    auto d = testing::Decode(out);
    if (!d || d->proto != IPPROTO_UDP || d->ip_dst != Ip4("10.99.1.5") || d->dport != 8080 ||
        d->ip_src != Ip4("10.99.0.2") || !d->ip_csum_ok || !d->l4_csum_ok) {
      std::fprintf(stderr, "xdp_pps: %s does not forward the NodePort flow: %s\n", name,
                   out.empty() ? "nothing reached g0" : testing::Describe(out).c_str());
    } else {
      const testing::Bytes reply = Packet::Eth(testing::ParseMac("02:b0:00:00:00:01"),
                                               testing::ParseMac("02:b0:00:00:00:02"))
                                       .IPv4("10.99.1.5", "10.99.0.2")
                                       .UDP(8080, d->sport)
                                       .Payload(std::string(18, 'y'))
                                       .Build();
      const int reply_gen = GeneratorProgram(g0, reply);
      testing::Bytes back = reply_gen < 0 ? testing::Bytes() : capture_one(reply_gen, reply);
      if (reply_gen >= 0) close(reply_gen);
      auto r = testing::Decode(back);
      ok = r && r->proto == IPPROTO_UDP && r->ip_dst == Ip4("10.99.2.7") &&
           r->dport == nf_port[i] && r->ip_src == Ip4("10.99.0.2") && r->sport == 30080 &&
           r->ip_csum_ok && r->l4_csum_ok;
      if (!ok) {
        std::fprintf(stderr, "xdp_pps: %s does not return the backend's reply: %s\n", name,
                     back.empty() ? "nothing reached g0" : testing::Describe(back).c_str());
      }
    }
    return bpf_xdp_attach(g0, sink, XDP_FLAGS_DRV_MODE, nullptr) == 0 && ok;
  };
  bool tc_attached = true;
  // Mode 2, the rig's floor: n0 sends every frame straight back (XDP_TX, no translation).
  auto use_mode = [&](int mode) -> bool {
    if (!(*dp)->DetachXdp().ok()) return false;
    bpf_xdp_detach(n0, XDP_FLAGS_DRV_MODE, nullptr);
    const bool netfilter = mode == 3 || mode == 4;
    if (!load_rules(mode)) return false;
    if (netfilter == tc_attached) {
      // (libbpf logs the tc hook's expected "not found" answers of a detach / re-attach)
      auto print = libbpf_set_print(nullptr);
      const bool ok = (netfilter ? (*dp)->DetachNative(n0) : (*dp)->AttachNative(n0)).ok();
      libbpf_set_print(print);
      if (!ok) return false;
      tc_attached = !netfilter;
    }
    if (netfilter) {
      return bpf_xdp_attach(n0, pass, XDP_FLAGS_DRV_MODE, nullptr) == 0 && check_netfilter(mode);
    }
    if (mode == 2) return bpf_xdp_attach(n0, bounce, XDP_FLAGS_DRV_MODE, nullptr) == 0;
    const bool xdp = mode == 1;
    if (xdp) {
      auto mode = (*dp)->AttachXdp(n0);
      if (!mode.ok() || *mode != loader::XdpMode::kNative) {
        std::fprintf(stderr, "xdp_pps: attach sluice_xdp_net: %s\n",
                     mode.ok() ? loader::XdpModeName(*mode) : mode.status().ToString().c_str());
        return false;
      }
      return true;
    }
    int err = bpf_xdp_attach(n0, pass, XDP_FLAGS_DRV_MODE, nullptr);
    if (err != 0) std::fprintf(stderr, "xdp_pps: attach bench_pass: %s\n", strerror(-err));
    return err == 0;
  };
  // The flow's first packet (conntrack, NAT port) through TC, and the translation checked once
  // per mode through test_run.
  for (bool xdp : {false, true}) {
    if (!use_mode(xdp ? 1 : 0)) return Fail("attach mode");
    int fd = xdp ? (*dp)->xdp_net_fd() : (*dp)->from_net_fd();
    testing::Bytes out(frame.size() + 64);
    struct xdp_md xctx {};
    xctx.data_end = static_cast<__u32>(frame.size());
    xctx.ingress_ifindex = n0;
    struct __sk_buff sctx {};
    sctx.ifindex = n0;
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame.data(), .data_out = out.data(),
                .data_size_in = static_cast<__u32>(frame.size()),
                .data_size_out = static_cast<__u32>(out.size()),
                .ctx_in = xdp ? static_cast<void*>(&xctx) : static_cast<void*>(&sctx),
                .ctx_size_in = static_cast<__u32>(xdp ? sizeof(xctx) : sizeof(sctx)), .repeat = 1);
    if (bpf_prog_test_run_opts(fd, &opts) != 0) return Fail("test_run");
    out.resize(opts.data_size_out);
    auto d = testing::Decode(out);
    const int want = xdp ? XDP_TX : testing::kTcRedirect;
    if (static_cast<int>(opts.retval) != want || !d || d->ip_dst != Ip4("10.99.1.5") ||
        d->ip_src != Ip4("10.99.0.2") || !d->ip_csum_ok || !d->l4_csum_ok) {
      return Fail(std::string(xdp ? "XDP" : "TC") +
                  " does not forward the NodePort flow: " + testing::Describe(out));
    }
  }

  constexpr int kModes = 5;
  std::vector<double> pps[kModes];
  const char* names[kModes] = {"TC", "XDP", "floor", "iptables", "nftables"};
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < kModes; ++k) {
      const int mode = (r + k) % kModes;
      if (!use_mode(mode)) return Fail(std::string("set up mode ") + names[mode]);
      const int mode_gen = mode >= 3 ? nf_gen[mode - 3] : gen;
      const testing::Bytes& mode_frame = mode >= 3 ? nf_frame[mode - 3] : frame;
      uint64_t before = ReceivedOnG0();
      double secs = Generate(mode_gen, mode_frame, frames);
      if (secs <= 0) return Fail("generator");
      // The last batch may still be in g0's queue: wait until its counter stops moving.
      uint64_t after = ReceivedOnG0(), last = 0;
      for (int i = 0; i < 50 && after != last; ++i) {
        last = after;
        usleep(2000);
        after = ReceivedOnG0();
      }
      pps[mode].push_back(static_cast<double>(after - before) / secs);
      if (getenv("XDP_PPS_DEBUG")) {
        std::fprintf(stderr, "round %d %s: %llu frames in %.3f s\n", r, names[mode],
                     static_cast<unsigned long long>(after - before), secs);
        std::system("ethtool -S n0 | grep -v ': 0$'; ethtool -S g0 | grep -v ': 0$'");
        if (mode >= 3) std::system("cat /proc/net/nf_conntrack");
      }
      if (after - before < frames / 2) {
        std::fprintf(stderr, "xdp_pps: %s round %d forwarded %llu of %u frames\n", names[mode], r,
                     static_cast<unsigned long long>(after - before), frames);
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // The rules go before the namespace does (it goes with this process).
  if (!load_rules(0)) return Fail("remove the netfilter rules");
  const double tc = median(pps[0]), xdp = median(pps[1]), floor = median(pps[2]),
               ipt = median(pps[3]), nft = median(pps[4]);
  std::printf(
      "NodePort to a remote backend, 64-byte UDP, one established flow, %u frames x %d "
      "rounds per mode\n",
      frames, rounds);
  std::printf("  TC  (sluice_from_net, bpf_redirect):  %10.0f pps\n", tc);
  std::printf("  XDP (sluice_xdp_net, XDP_TX):         %10.0f pps\n", xdp);
  std::printf("  floor (XDP_TX, no translation):       %10.0f pps\n", floor);
  std::printf("  iptables (kube-proxy, legacy):        %10.0f pps\n", ipt);
  std::printf("  nftables (kube-proxy, nft):           %10.0f pps\n", nft);
  std::printf("  XDP / TC:                             %10.2fx\n", xdp / tc);
  std::printf("  XDP / iptables:                       %10.2fx\n", xdp / ipt);
  std::printf("  XDP / nftables:                       %10.2fx\n", xdp / nft);
  std::printf("  TC / iptables:                        %10.2fx\n", tc / ipt);
  return 0;
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) {
  uint32_t frames = argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 1000000;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 6;
  return sluice::bench::Run(frames, rounds);
}
