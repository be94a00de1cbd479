#include "server/http_server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>

#include "server/auth.h"
#include "server/lora_endpoints.h"
#include "server/openai_chat.h"
#include "server/openai_completions.h"
#include "server/openai_responses.h"
#include "server/request_fields.h"
#include "server/sglang_generate.h"
#include "server/sse.h"
#include "server/tokenize_endpoints.h"

namespace beamline::server {

namespace {

constexpr const char* kJson = "application/json";

HttpResponse json_response(const Json& json) { return HttpResponse{200, kJson, dump_json(json), {}}; }

HttpResponse text_response(std::string text) { return HttpResponse{200, "text/plain", std::move(text), {}}; }

}  // namespace

HttpResponse error_response(const ApiError& error) {
  return HttpResponse{error.status(), kJson, dump_json(error.to_json()), {}};
}

std::string check_http_threads(std::size_t threads) {
  if (threads >= kMinHttpThreads && threads <= kMaxHttpThreads) return "";
  return fmt::format("--http-threads {}: must be {} to {}. It is the number of event-loop threads, each serving any "
                     "number of connections (a connection no longer needs a thread of its own)",
                     threads, kMinHttpThreads, kMaxHttpThreads);
}

ApiServer::ApiServer(ServingContext& context, HttpOptions options)
    : context_(context),
      options_(std::move(options)),
      control_(context, options_.weight_update_dir, options_.weight_sync_timeout_seconds) {
  const std::string refused = check_http_threads(options_.http_threads);
  require(refused.empty(), "{}", refused);
  add_routes();
  add_control_routes();
  HttpTransportOptions transport;
  transport.event_loop_threads = options_.http_threads;
  transport.worker_threads = kHttpWorkerThreads;
  transport.max_body_bytes = options_.max_request_body_bytes;
  transport.keep_alive_timeout = kKeepAliveTimeout;
  transport_ = std::make_unique<HttpTransport>(
      transport, [this](HttpRequest request, std::shared_ptr<Exchange> exchange) {
        handle(std::move(request), std::move(exchange));
      },
      [this](int status, const std::string& message) {
        if (status == 413) return error_response(payload_too_large(options_.max_request_body_bytes));
        return error_response(ApiError(status, "invalid_request_error", message));
      },
      [this](int status) { counters_.count_response(status); });
}

ApiServer::~ApiServer() = default;

void ApiServer::route(const std::string& method, const std::string& path, Route route) {
  routes_[path][method] = std::move(route);
}

void ApiServer::add_routes() {
  const auto answer = [](std::function<HttpResponse(const HttpRequest&)> make) -> Handler {
    return [make](const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
      exchange->respond(make(request));
    };
  };
  const auto generation = [this](void (ApiServer::*handler)(const HttpRequest&, const std::shared_ptr<Exchange>&)) {
    return Route{[this, handler](const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
      (this->*handler)(request, exchange);
    }};
  };
  route("GET", "/health", {answer([this](const HttpRequest&) { return health(); }), false, false});
  route("GET", "/metrics", {answer([this](const HttpRequest&) { return metrics(); }), false, false});
  route("GET", "/v1/models", {answer([this](const HttpRequest&) { return models(); }), false});
  route("GET", "/version", {answer([](const HttpRequest&) { return json_response({{"version", beamline_version()}}); }),
                            false});
  route("POST", "/v1/chat/completions", generation(&ApiServer::chat_completions));
  route("POST", "/v1/completions", generation(&ApiServer::completions));
  route("POST", "/v1/responses", generation(&ApiServer::responses));
  route("POST", "/generate", generation(&ApiServer::generate));
  route("POST", "/tokenize", {answer([this](const HttpRequest& request) {
          return json_response(tokenize_response(parse_body(request.body), context_));
        })});
  route("POST", "/detokenize", {answer([this](const HttpRequest& request) {
          return json_response(detokenize_response(parse_body(request.body), context_));
        })});
  route("POST", "/v1/load_lora_adapter", {answer([this](const HttpRequest& request) {
          return text_response(load_lora_adapter(parse_body(request.body), context_));
        })});
  route("POST", "/v1/unload_lora_adapter", {answer([this](const HttpRequest& request) {
          return text_response(unload_lora_adapter(parse_body(request.body), context_));
        })});
}

void ApiServer::add_control_routes() {
  const auto control_request = [](const HttpRequest& request) {
    ControlRequest control;
    control.endpoint = request.path.substr(1);
    control.query = request.query;
    if (!request.body.empty()) control.body = parse_body(request.body);
    return control;
  };
  const auto post = [&](const std::string& path, std::function<Json(const ControlRequest&)> handler) {
    route("POST", path, {[control_request, handler](const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
      exchange->respond(json_response(handler(control_request(request))));
    }});
  };
  const auto get = [&](const std::string& path, std::function<Json()> handler) {
    route("GET", path, {[handler](const HttpRequest&, const std::shared_ptr<Exchange>& exchange) {
      exchange->respond(json_response(handler()));
    }});
  };
  post("/pause", [this](const ControlRequest& request) { return control_.pause(request); });
  post("/resume", [this](const ControlRequest&) { return control_.resume(); });
  get("/is_paused", [this] { return control_.is_paused(); });
  post("/sleep", [this](const ControlRequest& request) { return control_.sleep(request); });
  post("/wake_up", [this](const ControlRequest& request) { return control_.wake_up(request); });
  get("/is_sleeping", [this] { return control_.is_sleeping(); });
  post("/reset_prefix_cache", [this](const ControlRequest&) { return control_.reset_prefix_cache(); });
  post("/flush_cache", [this](const ControlRequest&) { return control_.reset_prefix_cache(); });  // SGLang's name
  get("/flush_cache", [this] { return control_.reset_prefix_cache(); });
  post("/update_weights_from_disk",
       [this](const ControlRequest& request) { return control_.update_weights_from_disk(request); });
  // Weight sync from a trainer under SGLang's names and, the same handlers, those SkyRL's remote engine calls on vLLM.
  for (const char* path : {"/init_weights_update_group", "/init_weight_update_communicator"}) {
    post(path, [this](const ControlRequest& request) { return control_.init_weights_update_group(request); });
  }
  for (const char* path : {"/update_weights_from_distributed", "/update_weights"}) {
    post(path, [this](const ControlRequest& request) { return control_.update_weights_from_distributed(request); });
  }
  post("/destroy_weights_update_group",
       [this](const ControlRequest& request) { return control_.destroy_weights_update_group(request); });
}

// On an event-loop thread: the key, the route, then the route's handler there or on the worker pool.
void ApiServer::handle(HttpRequest request, std::shared_ptr<Exchange> exchange) {
  if (options_.api_key && path_needs_api_key(request.path) &&
      !bearer_token_matches(request.authorization, *options_.api_key)) {
    return exchange->respond(error_response(unauthorized()));
  }
  const auto path = routes_.find(request.path);
  if (path == routes_.end()) return exchange->respond(error_response(not_found(request.path)));
  const auto method = path->second.find(request.method);
  if (method == path->second.end()) {
    HttpResponse refused = error_response(method_not_allowed(request.method, request.path));
    std::string allowed;
    for (const auto& [name, route] : path->second) allowed += (allowed.empty() ? "" : ", ") + name;
    refused.headers.emplace_back("Allow", allowed);
    return exchange->respond(std::move(refused));
  }
  const Route& route = method->second;
  if (!route.on_worker) return run_route(route, request, exchange);
  transport_->run_on_worker([this, &route, request = std::move(request), exchange = std::move(exchange)] {
    run_route(route, request, exchange);
  });
}

void ApiServer::run_route(const Route& route, const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  try {
    if (route.guarded && refusing_) throw server_shutting_down();
    route.handler(request, exchange);
  } catch (...) {
    exchange->respond(error_response(to_api_error(std::current_exception())));
  }
}

int ApiServer::bind() {
  options_.port = transport_->bind(options_.host, options_.port);
  return options_.port;
}

void ApiServer::serve() { transport_->serve(); }

void ApiServer::refuse_new_requests() { refusing_ = true; }

void ApiServer::abort_in_flight() {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(in_flight_mutex_);
    ids.assign(in_flight_.begin(), in_flight_.end());
  }
  for (const std::string& id : ids) context_.engine.abort(id);
}

void ApiServer::stop() { transport_->stop(); }

std::shared_ptr<OutputStream> ApiServer::submit(GenerationRequest request) {
  const std::string id = request.request_id;
  {
    std::lock_guard lock(in_flight_mutex_);
    in_flight_.insert(id);
  }
  try {
    return context_.engine.add_request(std::move(request));
  } catch (const InvalidRequest&) {
    release(id);
    throw;
  } catch (const Error& error) {
    release(id);
    // The engine refuses new work only once it is shutting down.
    spdlog::debug("engine refused request {}: {}", id, error.what());
    throw server_shutting_down();
  }
}

void ApiServer::release(const std::string& request_id) {
  {
    std::lock_guard lock(in_flight_mutex_);
    in_flight_.erase(request_id);
  }
  in_flight_changed_.notify_all();
}

void ApiServer::wait_until_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(in_flight_mutex_);
  in_flight_changed_.wait_for(lock, timeout, [&] { return in_flight_.empty(); });
}

void ApiServer::respond_when_done(const std::shared_ptr<Exchange>& exchange,
                                  std::vector<std::shared_ptr<OutputStream>> streams, Render render) {
  struct Collecting {
    std::shared_ptr<Exchange> exchange;
    std::vector<std::shared_ptr<OutputStream>> streams;
    std::vector<RequestOutput> outputs;
    std::atomic<std::size_t> remaining;
    Render render;
  };
  auto state = std::make_shared<Collecting>();
  state->exchange = exchange;
  state->streams = std::move(streams);
  state->outputs.resize(state->streams.size());
  state->remaining = state->streams.size();
  state->render = std::move(render);
  exchange->on_finished([this, state](bool written) {
    if (!written) {
      // Nobody will read the answer: free the KV blocks now, as for a stream whose client left.
      spdlog::info("client of {} went away before its answer: aborting it", state->streams.front()->request_id());
      for (const std::shared_ptr<OutputStream>& stream : state->streams) context_.engine.abort(stream->request_id());
    }
    for (const std::shared_ptr<OutputStream>& stream : state->streams) release(stream->request_id());
  });
  const auto collect = [state](std::size_t i) {
    state->outputs[i] = collect_output(*state->streams[i]);
    if (state->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    try {
      for (const RequestOutput& output : state->outputs) {
        if (output.error) throw internal_error("generation failed: " + *output.error);
      }
      state->exchange->respond(json_response(state->render(state->outputs)));
    } catch (...) {
      state->exchange->respond(error_response(to_api_error(std::current_exception())));
    }
  };
  for (std::size_t i = 0; i < state->streams.size(); ++i) {
    // The engine thread only hands the finished output over to a worker.
    state->streams[i]->on_ready([this, collect, i](bool finished) {
      if (finished) transport_->run_on_worker([collect, i] { collect(i); });
    });
  }
}

void ApiServer::respond_stream(const std::shared_ptr<Exchange>& exchange, std::shared_ptr<OutputStream> stream,
                               std::unique_ptr<SseResponder> responder) {
  struct Streaming {
    std::shared_ptr<OutputStream> stream;
    std::unique_ptr<SseResponder> responder;
    bool begun = false;
    bool finished = false;  // the last event was taken (on the connection's event-loop thread)
  };
  auto state = std::make_shared<Streaming>();
  state->stream = std::move(stream);
  state->responder = std::move(responder);
  ++counters_.active_streams;
  exchange->on_finished([this, state](bool) {
    // A client that went away mid-stream leaves an unfinished request, aborted so its KV blocks are freed.
    if (!state->finished) {
      spdlog::info("client of {} went away mid-stream: aborting it", state->stream->request_id());
      context_.engine.abort(state->stream->request_id());
    }
    release(state->stream->request_id());
    --counters_.active_streams;
  });
  // Called on the connection's event-loop thread whenever it can write: what the engine produced since.
  const auto source = [this, state]() -> std::optional<StreamChunk> {
    std::string text;
    try {
      if (!state->begun) {
        state->begun = true;
        text = state->responder->begin();
      }
      std::optional<RequestOutput> output = state->stream->next(std::chrono::milliseconds(0));
      if (output) {
        text += state->responder->on_output(*output);
        state->finished = output->finished;
      }
    } catch (...) {
      context_.engine.abort(state->stream->request_id());
      text += sse_error(to_api_error(std::current_exception()));
      state->finished = true;
    }
    if (state->finished) return StreamChunk{std::move(text), true};
    if (text.empty()) return std::nullopt;
    return StreamChunk{std::move(text), false};
  };
  OutputStream& events = *state->stream;
  exchange->respond_stream(
      HttpResponse{200, "text/event-stream", "", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}}}, source);
  events.on_ready([exchange](bool) { exchange->wake(); });
}

void ApiServer::chat_completions(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  const Json body = parse_body(request.body);
  auto plan = std::make_shared<ChatPlan>(plan_chat_completion(body, context_));
  const std::string id = new_response_id("chatcmpl");
  plan->request.request_id = id;
  std::shared_ptr<OutputStream> stream;
  try {
    stream = submit(plan->request);
  } catch (const InvalidRequest& invalid) {
    // A chat request has no `prompt`: what the engine calls the prompt comes from `messages`.
    throw invalid_request(invalid.param() == "prompt" ? "messages" : invalid.param(), invalid.what());
  }
  if (plan->stream.stream) {
    return respond_stream(exchange, std::move(stream), chat_completion_stream(id, context_, std::move(*plan)));
  }
  respond_when_done(exchange, {std::move(stream)}, [this, id, plan](const std::vector<RequestOutput>& outputs) {
    return chat_completion_response(id, context_, *plan, outputs.front());
  });
}

void ApiServer::responses(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  const Json body = parse_body(request.body);
  auto plan = std::make_shared<ResponsesPlan>(plan_response(body, context_));
  const std::string id = new_item_id("resp");
  plan->chat.request.request_id = id;
  std::shared_ptr<OutputStream> stream;
  try {
    stream = submit(plan->chat.request);
  } catch (const InvalidRequest& invalid) {
    // The engine's `prompt` is the request's `input`; its max_tokens is max_output_tokens.
    const std::string param = invalid.param() == "prompt" ? "input"
                              : invalid.param() == "max_tokens" ? "max_output_tokens"
                                                                : invalid.param();
    throw invalid_request(param, invalid.what());
  }
  if (plan->chat.stream.stream) {
    return respond_stream(exchange, std::move(stream), response_stream(id, context_, std::move(*plan)));
  }
  respond_when_done(exchange, {std::move(stream)}, [this, id, plan](const std::vector<RequestOutput>& outputs) {
    return response_object(id, context_, *plan, outputs.front());
  });
}

void ApiServer::completions(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  const Json body = parse_body(request.body);
  auto plans = std::make_shared<std::vector<CompletionPlan>>(plan_completions(body, context_));
  const std::string id = new_response_id("cmpl");
  std::vector<GenerationRequest*> requests;
  for (std::size_t p = 0; p < plans->size(); ++p) {
    (*plans)[p].request.request_id = plans->size() == 1 ? id : fmt::format("{}-{}", id, p);
    requests.push_back(&(*plans)[p].request);
  }
  std::vector<std::shared_ptr<OutputStream>> streams = submit_batch(requests);
  if (plans->front().stream.stream) {
    return respond_stream(exchange, std::move(streams.front()),
                          completion_stream(id, context_, std::move(plans->front())));
  }
  respond_when_done(exchange, std::move(streams), [this, id, plans](const std::vector<RequestOutput>& outputs) {
    return completion_response(id, context_, *plans, outputs);
  });
}

std::vector<std::shared_ptr<OutputStream>> ApiServer::submit_batch(const std::vector<GenerationRequest*>& requests) {
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (std::size_t p = 0; p < requests.size(); ++p) {
    try {
      streams.push_back(submit(*requests[p]));
    } catch (const InvalidRequest& invalid) {
      // All or none: those already queued are taken back.
      for (const std::shared_ptr<OutputStream>& queued : streams) {
        context_.engine.abort(queued->request_id());
        collect_output(*queued);
        release(queued->request_id());
      }
      if (requests.size() == 1) throw;
      throw invalid_request(invalid.param(), fmt::format("prompt {} of the batch: {}", p, invalid.what()));
    }
  }
  return streams;
}

void ApiServer::generate(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  const Json body = parse_body(request.body);
  auto plan = std::make_shared<GeneratePlan>(plan_generate(body, context_));
  const std::string id = new_response_id("gen");
  std::vector<GenerationRequest*> requests;
  for (std::size_t p = 0; p < plan->requests.size(); ++p) {
    plan->requests[p].request_id = plan->requests.size() == 1 ? id : fmt::format("{}-{}", id, p);
    requests.push_back(&plan->requests[p]);
  }
  respond_when_done(exchange, submit_batch(requests), [this, plan](const std::vector<RequestOutput>& outputs) {
    return generate_response(context_, *plan, outputs);
  });
}

HttpResponse ApiServer::health() const {
  if (refusing_) return error_response(server_shutting_down());
  return HttpResponse{200, "", "", {}};
}

HttpResponse ApiServer::models() const {
  const Json model = {{"id", context_.model_name},
                      {"object", "model"},
                      {"created", context_.created},
                      {"owned_by", "beamline"},
                      {"root", context_.model_name},
                      {"parent", nullptr},
                      {"max_model_len", context_.engine.config().max_model_len}};
  Json data = Json::array({model});
  for (Json& card : lora_model_cards(context_)) data.push_back(std::move(card));
  return json_response(Json{{"object", "list"}, {"data", std::move(data)}});
}

HttpResponse ApiServer::metrics() const {
  return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8",
                      render_metrics(context_.engine.stats(), counters_.responses_by_status(),
                                     counters_.active_streams.load(), context_.model_name),
                      {}};
}

}  // namespace beamline::server
