#pragma once
// HTTP/1.1 serving over Boost.Beast: a few event-loop threads hold every connection (an idle or slow client costs its
// socket and buffers, not a thread), and a small worker pool runs the handlers that may block. The routes and what they
// answer live in http_server.cpp; this file knows only requests, responses and connections.
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace beamline::server {

struct HttpRequest {
  std::string method;  // as sent: "GET", "POST", ...
  std::string path;    // the target without its query
  std::map<std::string, std::string> query;  // decoded
  std::string authorization;
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// What a streamed response's source gives when asked: text to write, and whether it is the end.
struct StreamChunk {
  std::string text;
  bool last = false;
};

// One request being answered. Thread-safe: a handler may answer from any thread, once.
class Exchange {
 public:
  virtual ~Exchange() = default;
  // The whole answer.
  virtual void respond(HttpResponse response) = 0;
  // A chunked answer: `source` is called on the connection's event-loop thread whenever the connection can take more
  // (after the headers, after each write, and after wake()); nullopt means nothing yet. Only one write is in flight at a
  // time, so a slow reader gets what piled up in one larger chunk.
  virtual void respond_stream(HttpResponse head, std::function<std::optional<StreamChunk>()> source) = 0;
  // The stream's source may have more (callable from any thread, e.g. the engine's on_ready).
  virtual void wake() = 0;
  // Called once when the exchange ends: `written` true once the whole answer has been written, false when the client
  // went away first (closed or reset the connection: its request should be aborted). Register it before answering.
  // Runs on the connection's event-loop thread, or at once on the caller's when the connection is already gone.
  virtual void on_finished(std::function<void(bool written)> callback) = 0;
};

struct HttpTransportOptions {
  std::size_t event_loop_threads = 2;
  std::size_t worker_threads = 8;
  std::size_t max_body_bytes = std::size_t{32} << 20;
  std::size_t max_header_bytes = std::size_t{64} << 10;
  std::chrono::milliseconds keep_alive_timeout{5000};   // between requests (and before the first)
  std::chrono::milliseconds body_timeout{60000};        // the headers seen, for the rest of the request
};

// Given each complete request on an event-loop thread: must not block (hand blocking work to run_on_worker).
using RequestHandler = std::function<void(HttpRequest, std::shared_ptr<Exchange>)>;
// The JSON body and type of an error the transport answers itself (400, 413, 431, 503).
using ErrorRenderer = std::function<HttpResponse(int status, const std::string& message)>;

class HttpTransport {
 public:
  HttpTransport(HttpTransportOptions options, RequestHandler handler, ErrorRenderer render_error,
                std::function<void(int status)> count_response);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds and listens (fails naming host and port); returns the port, useful with port 0.
  int bind(const std::string& host, int port);
  // Runs the event loop until stop(); returns after its threads ended.
  void serve();
  // Closes the listening socket and every connection; serve() returns.
  void stop();
  // Runs `job` on the worker pool (for what may block: waiting on the engine, loading files).
  void run_on_worker(std::function<void()> job);

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace beamline::server
