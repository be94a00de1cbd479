#pragma once
// The OpenAI-compatible HTTP server: its routes and what they answer, over the event-driven transport of
// http_transport.h. The event-loop threads hold every connection and answer the quick endpoints (/health, /metrics);
// a small worker pool parses requests and hands them to the engine; the engine's output is written as it comes (a
// stream) or once complete, without any thread waiting for it. The engine thread alone runs the model.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "server/api_error.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/rollout_control.h"
#include "server/serving_context.h"
#include "server/sse.h"

namespace beamline::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                                         // 0: any free port (see ApiServer::port)
  std::optional<std::string> api_key;                      // every /v1/* request must send it as a Bearer token
  std::size_t max_request_body_bytes = std::size_t{32} << 20;
  std::size_t http_threads = 2;                            // event-loop threads (kMinHttpThreads..kMaxHttpThreads)
  std::optional<std::filesystem::path> weight_update_dir;  // /update_weights_from_disk reads only below it
  double weight_sync_timeout_seconds = 600;                // a weight update group's wait for its trainer
};

// --http-threads counts event-loop threads, each holding any number of connections.
inline constexpr std::size_t kMinHttpThreads = 1;
inline constexpr std::size_t kMaxHttpThreads = 64;
// Threads that run the handlers which may block (parsing and tokenizing a request, control endpoints that wait).
inline constexpr std::size_t kHttpWorkerThreads = 8;
// An idle keep-alive connection (or one that has not sent its first request yet) is closed after this long
// (uvicorn's timeout_keep_alive, vLLM's default).
inline constexpr std::chrono::seconds kKeepAliveTimeout{5};

// "" when `threads` is a valid --http-threads, else the message refusing it.
std::string check_http_threads(std::size_t threads);

class ApiServer {
 public:
  ApiServer(ServingContext& context, HttpOptions options);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds the listening socket (fails naming host and port); returns the port, useful with port 0.
  int bind();
  // Serves connections until stop(); returns after the event-loop threads have ended.
  void serve();

  // Shutdown, first step: /v1 requests and /health get 503 from now on; requests in flight go on.
  void refuse_new_requests();
  bool refusing_new_requests() const { return refusing_.load(); }
  // Aborts every request in flight (their streams end with finish_reason "abort").
  void abort_in_flight();
  // Waits until no request is in flight (every response written), at most `timeout`.
  void wait_until_idle(std::chrono::milliseconds timeout);
  // Closes the listening socket and every connection, and ends serve().
  void stop();

 private:
  using Handler = std::function<void(const HttpRequest&, const std::shared_ptr<Exchange>&)>;
  struct Route {
    Handler handler;
    bool on_worker = true;   // false: answered on the event loop (must not block)
    bool guarded = true;     // refused with 503 once shutting down
  };
  void add_routes();
  void add_control_routes();
  void route(const std::string& method, const std::string& path, Route route);
  void handle(HttpRequest request, std::shared_ptr<Exchange> exchange);
  void run_route(const Route& route, const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);

  void chat_completions(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);
  void completions(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);
  void responses(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);  // OpenAI's /v1/responses
  void generate(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);   // SGLang's /generate
  HttpResponse health() const;
  HttpResponse models() const;
  HttpResponse metrics() const;

  // Queues a request in the engine (400 for what the engine rejects, 503 once shutting down).
  std::shared_ptr<OutputStream> submit(GenerationRequest request);
  // A batch (one request per prompt), all or none: a refused one takes back those queued, and its error names it.
  std::vector<std::shared_ptr<OutputStream>> submit_batch(const std::vector<GenerationRequest*>& requests);
  // Answers with render(outputs) once every stream has ended (non-streaming responses), a 500 if one failed; no thread
  // waits meanwhile. A client that goes away first has the requests aborted, so their KV blocks are freed at once.
  using Render = std::function<Json(const std::vector<RequestOutput>&)>;
  void respond_when_done(const std::shared_ptr<Exchange>& exchange, std::vector<std::shared_ptr<OutputStream>> streams,
                         Render render);
  // Writes the stream's events as server-sent events as the engine produces them.
  void respond_stream(const std::shared_ptr<Exchange>& exchange, std::shared_ptr<OutputStream> stream,
                      std::unique_ptr<SseResponder> responder);
  void release(const std::string& request_id);

  ServingContext& context_;
  HttpOptions options_;
  HttpCounters counters_;
  RolloutControl control_;
  std::atomic<bool> refusing_{false};
  std::mutex in_flight_mutex_;
  std::condition_variable in_flight_changed_;
  std::unordered_set<std::string> in_flight_;
  std::map<std::string, std::map<std::string, Route>> routes_;  // path -> method -> route
  std::unique_ptr<HttpTransport> transport_;                     // last: its threads end before the rest goes
};

// The OpenAI-style error JSON as an HTTP response.
HttpResponse error_response(const ApiError& error);

}  // namespace beamline::server
