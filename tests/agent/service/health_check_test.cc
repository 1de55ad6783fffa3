// Health-check NodePorts over real HTTP on 127.0.0.1.
#include "agent/service/health_check.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A port nothing listens on right now (the kernel's pick for an ephemeral bind).
uint16_t FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

HealthCheck Check(uint16_t port, int local) { return HealthCheck{"shop/front", port, local}; }

TEST(HealthCheckServersTest, AnswersWithLocalEndpointCountAndFollowsUpdates) {
  HealthCheckServers servers("127.0.0.1");
  uint16_t port = FreePort();
  servers.Update("shop/front", Check(port, 2));
  EXPECT_THAT(servers.ports(), ElementsAre(port));

  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  auto body = nlohmann::json::parse(res->body);
  EXPECT_EQ(body["service"]["namespace"], "shop");
  EXPECT_EQ(body["service"]["name"], "front");
  EXPECT_EQ(body["localEndpoints"], 2);
  EXPECT_EQ(body["serviceProxyHealthy"], true);

  servers.Update("shop/front", Check(port, 0));
  res = c.Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(nlohmann::json::parse(res->body)["localEndpoints"], 0);
}

TEST(HealthCheckServersTest, ListenerMovesWithThePortAndStopsWithTheService) {
  HealthCheckServers servers("127.0.0.1");
  uint16_t a = FreePort();
  servers.Update("shop/front", Check(a, 1));
  uint16_t b = FreePort();
  servers.Update("shop/front", Check(b, 1));
  EXPECT_THAT(servers.ports(), ElementsAre(b));
  httplib::Client ca("127.0.0.1", a);
  EXPECT_FALSE(ca.Get("/"));  // closed: connection refused
  httplib::Client cb("127.0.0.1", b);
  auto res = cb.Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);

  servers.Update("shop/front", std::nullopt);
  EXPECT_THAT(servers.ports(), IsEmpty());
  httplib::Client again("127.0.0.1", b);
  EXPECT_FALSE(again.Get("/"));
}

TEST(HealthCheckServersTest, PortInUseIsRetriedAtTheNextUpdate) {
  uint16_t port = FreePort();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  HealthCheckServers servers("127.0.0.1");
  servers.Update("shop/front", Check(port, 1));
  EXPECT_THAT(servers.ports(), IsEmpty());
  close(fd);
  servers.Update("shop/front", Check(port, 1));
  EXPECT_THAT(servers.ports(), ElementsAre(port));
  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

}  // namespace
}  // namespace sluice::agent
