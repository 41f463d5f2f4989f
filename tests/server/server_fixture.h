// An in-process server over the fake codec and the script engine, on a free port, plus small client helpers.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include "fake_model.h"
#include "http_test_client.h"
#include "server/http_server.h"

namespace latent::testing {

struct ServerFixture {
  FakeCodec codec;
  ScriptEngine engine;
  Metrics metrics;
  std::unique_ptr<Scheduler> sched;
  std::shared_ptr<server::Service> svc;
  std::unique_ptr<server::HttpServer> http;
  std::thread th;
  int port = 0;

  explicit ServerFixture(server::HttpOptions ho = {}, SchedulerOptions so = {}, server::ServiceOptions svo = {},
                         bool ready = true) {
    ho.port = 0;
    ho.threads = 2;
    so.max_context = 256;
    sched = std::make_unique<Scheduler>(engine, so, &metrics);
    sched->start();
    metrics.set_gauge_source([s = sched.get()] { return s->gauges(); });
    server::ModelInfo info;
    info.served_names = {"fake-model", "fake-alias"};
    info.max_model_len = 256;
    info.vocab_size = ScriptEngine::kV;
    info.eos_ids = {FakeCodec::kEos, FakeCodec::kUser, FakeCodec::kObservation};
    info.created = 1767225600;
    info.fingerprint = "fp_0123456789ab";
    svc = std::make_shared<server::Service>(info, svo, codec, *sched, metrics);
    http = std::make_unique<server::HttpServer>(ho, metrics);
    if (ready) http->set_service(svc);
    port = http->bind();
    th = std::thread([this] { http->serve(); });
  }
  ~ServerFixture() {
    http->stop();
    if (th.joinable()) th.join();
    sched->stop();
  }
  HttpClient client() const { return HttpClient(port, 20); }
};

// A raw connection: sends an HTTP request and lets the test close the socket whenever it wants.
struct RawConn {
  int fd = -1;
  RawConn(int port, const std::string& path, const std::string& body) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    const std::string req =
        "POST " + path +
        " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\n\r\n" + body;
    (void)!write(fd, req.data(), req.size());
  }
  std::string read_some() {
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }
  void close_now() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ~RawConn() { close_now(); }
};

}  // namespace latent::testing
