#pragma once
// The OpenAI-compatible HTTP server over cpp-httplib. HTTP threads (one per connection being served)
// parse and validate requests, hand them to the engine and wait on each request's output stream; the
// engine thread alone runs the model.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "server/api_error.h"
#include "server/metrics.h"
#include "server/rollout_control.h"
#include "server/serving_context.h"
#include "server/sse.h"

namespace httplib {
class Request;
class Response;
}  // namespace httplib

namespace beamline::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                                         // 0: any free port (see ApiServer::port)
  std::optional<std::string> api_key;                      // every /v1/* request must send it as a Bearer token
  std::size_t max_request_body_bytes = std::size_t{32} << 20;
  std::size_t http_threads = 8192;                         // connections served at once, a thread each (connection_threads.h)
  std::optional<std::filesystem::path> weight_update_dir;  // /update_weights_from_disk reads only below it
  double weight_sync_timeout_seconds = 600;                // a weight update group's wait for its trainer
};

class ListeningServer;

class ApiServer {
 public:
  ApiServer(ServingContext& context, HttpOptions options);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds the listening socket (fails naming host and port); returns the port, useful with port 0.
  int bind();
  // Accepts connections until stop(); returns after every connection thread has ended.
  void serve();

  // Shutdown, first step: /v1 requests and /health get 503 from now on; requests in flight go on.
  void refuse_new_requests();
  bool refusing_new_requests() const { return refusing_.load(); }
  // Aborts every request in flight (their streams end with finish_reason "abort").
  void abort_in_flight();
  // Waits until no request is in flight (every response written), at most `timeout`.
  void wait_until_idle(std::chrono::milliseconds timeout);
  // Closes the listening socket and ends serve() (open streams are cut at their next write).
  void stop();

 private:
  template <typename Body>
  void guarded(const httplib::Request& request, httplib::Response& response, Body&& body);
  void chat_completions(const httplib::Request& request, httplib::Response& response);
  void completions(const httplib::Request& request, httplib::Response& response);
  void responses(const httplib::Request& request, httplib::Response& response);  // OpenAI's /v1/responses
  void generate(const httplib::Request& request, httplib::Response& response);  // SGLang's /generate
  void models(httplib::Response& response) const;
  // The control endpoints of rollout_control.h.
  void add_control_routes();
  void metrics(httplib::Response& response) const;

  // Queues a request in the engine (400 for what the engine rejects, 503 once shutting down).
  std::shared_ptr<OutputStream> submit(GenerationRequest request);
  // A batch (one request per prompt), all or none: a refused one takes back those queued, and its error names it.
  std::vector<std::shared_ptr<OutputStream>> submit_batch(const std::vector<GenerationRequest*>& requests);
  // Waits for the whole output of each stream (non-streaming responses); unregisters the requests. A client that
  // goes away meanwhile has them aborted, so their KV blocks are freed at once as a stream's are.
  std::vector<RequestOutput> wait_for(const httplib::Request& request,
                                      const std::vector<std::shared_ptr<OutputStream>>& streams);
  void respond_stream(httplib::Response& response, std::shared_ptr<OutputStream> stream,
                      std::unique_ptr<SseResponder> responder);
  void release(const std::string& request_id);

  ServingContext& context_;
  HttpOptions options_;
  std::unique_ptr<ListeningServer> http_;
  HttpCounters counters_;
  RolloutControl control_;
  std::atomic<bool> refusing_{false};
  std::mutex in_flight_mutex_;
  std::condition_variable in_flight_changed_;
  std::unordered_set<std::string> in_flight_;
};

void write_error(httplib::Response& response, const ApiError& error);

}  // namespace beamline::server
