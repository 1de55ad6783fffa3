#include "agent/bgp/start.h"

#include "agent/metrics/registry.h"

namespace sluice::agent {

absl::StatusOr<std::unique_ptr<RunningBgp>> StartBgp(const StartPieces& pieces,
                                                     const bgp::BgpOptions& options,
                                                     const Node& node,
                                                     const std::string& bird_binary) {
  bgp::SpeakerOptions speaker_options{.bgp = options,
                                      .router_id = node.node_ip,
                                      .pod_cidrs = {node.pod_cidr},
                                      .dir = pieces.state_dir + "/bgp",
                                      .bird_binary = bird_binary};
  if (speaker_options.bgp.log_file.empty()) {
    speaker_options.bgp.log_file = speaker_options.dir + "/bird.log";
  }
  auto speaker = bgp::Speaker::Start(std::move(speaker_options));
  if (!speaker.ok()) return StartError(speaker.status(), "BGP speaker");
  auto running = std::make_unique<RunningBgp>();
  running->speaker = std::move(*speaker);
  const bgp::Speaker* s = running->speaker.get();
  int id = pieces.registry->AddCollector([s](metrics::ScrapeSink& sink) {
    sink.Gauge("sluice_bgp_speaker_up", "Whether BIRD, the node's BGP speaker, answers", {},
               s->speaker_up() ? 1 : 0);
    sink.Counter("sluice_bgp_speaker_restarts_total",
                 "Times the agent found BIRD gone and started it again (graceful restart)", {},
                 static_cast<double>(s->speaker_restarts()));
    sink.Gauge("sluice_bgp_advertised_prefixes", "Prefixes this node announces to every peer", {},
               static_cast<double>(s->options().pod_cidrs.size()));
    auto sessions = s->sessions();
    for (const auto& peer : s->options().bgp.peers) {
      std::string name = bgp::PeerProtocolName(peer.address);
      bool established = false;
      for (const auto& session : sessions) {
        if (session.name == name) established = session.established();
      }
      sink.Gauge("sluice_bgp_session_established",
                 "Whether the BGP session to the peer is Established",
                 {{"peer", peer.address.ToString()}, {"peer_asn", std::to_string(peer.asn)}},
                 established ? 1 : 0);
    }
  });
  running->collector.emplace(*pieces.registry, id);
  return running;
}

}  // namespace sluice::agent
