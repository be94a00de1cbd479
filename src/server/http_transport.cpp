#include "server/http_transport.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cstring>
#include <thread>

#include "util/error.h"

namespace beamline::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

constexpr int kListenBacklog = 4096;
// Bytes a client may send after its request while the answer is being made (pipelining) before the server stops
// reading them; past it, a client that leaves is noticed at the next write instead.
constexpr std::size_t kMaxPipelinedBytes = std::size_t{64} << 10;
// After an error answer on a connection that will close, what the client still sends is read and dropped for this
// long, so that closing with unread bytes does not reset the connection before the client reads the answer.
constexpr std::chrono::seconds kLingerOnError{2};
// accept() failing for want of descriptors (EMFILE) is retried after this pause.
constexpr std::chrono::milliseconds kAcceptRetry{50};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// application/x-www-form-urlencoded decoding of one query key or value ('+' is a space; a bad escape is kept as is).
std::string decode_query_part(std::string_view text) {
  std::string decoded;
  decoded.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      decoded += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() && hex_digit(text[i + 1]) >= 0 && hex_digit(text[i + 2]) >= 0) {
      decoded += static_cast<char>(hex_digit(text[i + 1]) * 16 + hex_digit(text[i + 2]));
      i += 2;
    } else {
      decoded += text[i];
    }
  }
  return decoded;
}

std::map<std::string, std::string> parse_query(std::string_view query) {
  std::map<std::string, std::string> parsed;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    parsed[decode_query_part(pair.substr(0, eq))] =
        eq == std::string_view::npos ? std::string{} : decode_query_part(pair.substr(eq + 1));
  }
  return parsed;
}

// Read errors that mean the client left or went quiet, not that it sent something wrong.
bool is_departure(const beast::error_code& error) {
  return error == http::error::end_of_stream || error == net::error::eof || error == beast::error::timeout ||
         error == net::error::operation_aborted || error == net::error::connection_reset ||
         error == http::error::partial_message;
}

}  // namespace

struct HttpTransport::State {
  explicit State(HttpTransportOptions given) : options(given), io(static_cast<int>(given.event_loop_threads)),
                                               workers(given.worker_threads), acceptor(io), accept_retry(io) {}
  HttpTransportOptions options;
  RequestHandler handler;
  ErrorRenderer render_error;
  std::function<void(int)> count_response;
  net::io_context io;
  net::thread_pool workers;
  tcp::acceptor acceptor;
  net::steady_timer accept_retry;
  std::atomic<bool> stopping{false};
};

namespace {

using State = HttpTransport::State;

// One connection, served on its strand: read a request, hand it to the handler, write the answer (whole or streamed),
// then read the next one, or close. While an answer is being made, a read stays posted so that a client that leaves
// is noticed at once (and its request aborted) rather than at the next write.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, State& state) : stream_(std::move(socket)), state_(state) {}

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }

  // The entry points of an Exchange (see ExchangeImpl): on the strand, for request `number`.
  void send_response(uint64_t number, HttpResponse response);
  void send_stream(uint64_t number, HttpResponse head, std::function<std::optional<StreamChunk>()> source);
  void pump(uint64_t number);
  void set_finished_callback(uint64_t number, std::function<void(bool written)> callback);
  net::any_io_executor executor() { return stream_.get_executor(); }

 private:
  void read_header();
  void on_header(const beast::error_code& error);
  void on_body(const beast::error_code& error);
  void on_read_error(const beast::error_code& error);
  void dispatch_request();
  void watch();
  void on_watch(const beast::error_code& error, std::size_t bytes);
  void client_gone();
  void finish_response();
  void end_exchange(bool written);
  void after_response();
  void send_error_and_close(int status, const std::string& message);
  void linger();
  void close();
  template <typename Response>
  void set_headers(Response& response, const HttpResponse& given);

  beast::tcp_stream stream_;
  State& state_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, 4096> watch_buffer_{};
  std::array<char, 4096> linger_buffer_{};
  uint64_t request_number_ = 0;
  unsigned version_ = 11;
  bool keep_alive_ = false;
  bool answered_ = false;   // the answer was started for the current request
  bool complete_ = false;   // ... and completely written
  bool watching_ = false;   // a read is posted to notice the client leaving
  bool writing_ = false;
  bool gone_ = false;
  std::function<void(bool written)> finished_callback_;
  std::function<std::optional<StreamChunk>()> source_;
};

class ExchangeImpl : public Exchange {
 public:
  ExchangeImpl(const std::shared_ptr<Session>& session, uint64_t number)
      : session_(session), executor_(session->executor()), number_(number) {}

  void respond(HttpResponse response) override {
    if (auto session = session_.lock()) {
      net::dispatch(executor_, [session, number = number_, response = std::move(response)]() mutable {
        session->send_response(number, std::move(response));
      });
    }
  }
  void respond_stream(HttpResponse head, std::function<std::optional<StreamChunk>()> source) override {
    if (auto session = session_.lock()) {
      net::dispatch(executor_, [session, number = number_, head = std::move(head), source = std::move(source)]() mutable {
        session->send_stream(number, std::move(head), std::move(source));
      });
    }
  }
  void wake() override {
    if (auto session = session_.lock()) net::post(executor_, [session, number = number_] { session->pump(number); });
  }
  void on_finished(std::function<void(bool written)> callback) override {
    // A session that no longer exists closed its connection before the answer (registered before it) was written.
    auto session = session_.lock();
    if (!session) return callback(false);
    net::dispatch(executor_, [session, number = number_, callback = std::move(callback)]() mutable {
      session->set_finished_callback(number, std::move(callback));
    });
  }

 private:
  std::weak_ptr<Session> session_;
  net::any_io_executor executor_;
  const uint64_t number_;
};

void Session::read_header() {
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(state_.options.max_header_bytes));
  parser_->body_limit(state_.options.max_body_bytes);
  stream_.expires_after(state_.options.keep_alive_timeout);
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](const beast::error_code& error, std::size_t) {
                            self->on_header(error);
                          });
}

void Session::on_header(const beast::error_code& error) {
  if (error) return on_read_error(error);
  stream_.expires_after(state_.options.body_timeout);
  const auto expect = parser_->get().find(http::field::expect);
  if (expect != parser_->get().end() && beast::iequals(expect->value(), "100-continue")) {
    auto go_on = std::make_shared<http::response<http::empty_body>>(http::status::continue_, parser_->get().version());
    http::async_write(stream_, *go_on, [self = shared_from_this(), go_on](const beast::error_code& failed, std::size_t) {
      if (failed) return self->close();
      http::async_read(self->stream_, self->buffer_, *self->parser_,
                       [self](const beast::error_code& read_error, std::size_t) { self->on_body(read_error); });
    });
    return;
  }
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](const beast::error_code& read_error, std::size_t) {
                     self->on_body(read_error);
                   });
}

void Session::on_body(const beast::error_code& error) {
  if (error) return on_read_error(error);
  stream_.expires_never();
  dispatch_request();
}

void Session::on_read_error(const beast::error_code& error) {
  if (is_departure(error)) return close();
  if (error == http::error::header_limit) {
    return send_error_and_close(431, fmt::format("request headers larger than {} bytes", state_.options.max_header_bytes));
  }
  if (error == http::error::body_limit) return send_error_and_close(413, "request body too large");
  send_error_and_close(400, fmt::format("malformed HTTP request: {}", error.message()));
}

void Session::dispatch_request() {
  http::request<http::string_body> message = parser_->release();
  HttpRequest request;
  request.method = std::string(message.method_string());
  const std::string_view target(message.target().data(), message.target().size());
  const std::size_t question = target.find('?');
  request.path = std::string(target.substr(0, question));
  if (question != std::string_view::npos) request.query = parse_query(target.substr(question + 1));
  if (const auto found = message.find(http::field::authorization); found != message.end()) {
    request.authorization = std::string(found->value());
  }
  request.body = std::move(message.body());
  version_ = message.version();
  keep_alive_ = message.keep_alive();
  ++request_number_;
  answered_ = complete_ = gone_ = false;
  // The handler answers every request itself (errors included), inline or from another thread.
  state_.handler(std::move(request), std::make_shared<ExchangeImpl>(shared_from_this(), request_number_));
  // Answered at once (/health): a failed write says whether the client left. Otherwise watch for it meanwhile.
  if (!answered_) watch();
}

void Session::watch() {
  if (watching_ || gone_ || buffer_.size() >= kMaxPipelinedBytes) return;
  watching_ = true;
  stream_.async_read_some(net::buffer(watch_buffer_),
                          [self = shared_from_this()](const beast::error_code& error, std::size_t bytes) {
                            self->on_watch(error, bytes);
                          });
}

void Session::on_watch(const beast::error_code& error, std::size_t bytes) {
  watching_ = false;
  if (bytes > 0) {
    // The client's next request, sent before this answer: kept for the next read.
    net::buffer_copy(buffer_.prepare(bytes), net::buffer(watch_buffer_.data(), bytes));
    buffer_.commit(bytes);
  }
  if (error && error != net::error::operation_aborted) return client_gone();
  if (complete_) return after_response();
  if (!error) watch();
}

void Session::client_gone() {
  if (gone_) return;
  gone_ = true;
  end_exchange(false);
  close();
}

void Session::end_exchange(bool written) {
  source_ = nullptr;
  if (auto callback = std::move(finished_callback_)) {
    finished_callback_ = nullptr;
    callback(written);
  }
}

template <typename Response>
void Session::set_headers(Response& response, const HttpResponse& given) {
  if (!given.content_type.empty()) response.set(http::field::content_type, given.content_type);
  for (const auto& [name, value] : given.headers) response.set(name, value);
  response.keep_alive(keep_alive_);
}

void Session::send_response(uint64_t number, HttpResponse given) {
  if (number != request_number_ || answered_ || gone_) return;
  answered_ = true;
  state_.count_response(given.status);
  auto response = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(given.status), version_);
  set_headers(*response, given);
  response->body() = std::move(given.body);
  response->prepare_payload();
  writing_ = true;
  http::async_write(stream_, *response,
                    [self = shared_from_this(), response](const beast::error_code& error, std::size_t) {
                      self->writing_ = false;
                      if (error) return self->client_gone();
                      self->finish_response();
                    });
}

void Session::send_stream(uint64_t number, HttpResponse head, std::function<std::optional<StreamChunk>()> source) {
  if (number != request_number_ || answered_ || gone_) return;
  answered_ = true;
  state_.count_response(head.status);
  source_ = std::move(source);
  auto response = std::make_shared<http::response<http::empty_body>>(static_cast<http::status>(head.status), version_);
  set_headers(*response, head);
  response->chunked(true);
  auto serializer = std::make_shared<http::response_serializer<http::empty_body>>(*response);
  writing_ = true;
  http::async_write_header(stream_, *serializer,
                           [self = shared_from_this(), response, serializer](const beast::error_code& error, std::size_t) {
                             self->writing_ = false;
                             if (error) return self->client_gone();
                             self->pump(self->request_number_);
                           });
}

void Session::pump(uint64_t number) {
  if (number != request_number_ || writing_ || gone_ || !source_) return;
  std::optional<StreamChunk> chunk;
  do {
    chunk = source_();
    if (!chunk) return;
  } while (chunk->text.empty() && !chunk->last);
  const bool last = chunk->last;
  if (last) source_ = nullptr;
  auto text = std::make_shared<std::string>(std::move(chunk->text));
  const auto written = [self = shared_from_this(), text, last](const beast::error_code& error, std::size_t) {
    self->writing_ = false;
    if (error) return self->client_gone();
    if (last) return self->finish_response();
    self->pump(self->request_number_);
  };
  writing_ = true;
  if (text->empty()) {
    net::async_write(stream_, http::make_chunk_last(), written);
  } else if (last) {
    net::async_write(stream_, beast::buffers_cat(http::make_chunk(net::buffer(*text)), http::make_chunk_last()),
                     written);
  } else {
    net::async_write(stream_, http::make_chunk(net::buffer(*text)), written);
  }
}

void Session::set_finished_callback(uint64_t number, std::function<void(bool written)> callback) {
  // A later request on the connection means this one's answer was written.
  if (number != request_number_ || complete_) return callback(true);
  if (gone_) return callback(false);
  finished_callback_ = std::move(callback);
}

void Session::finish_response() {
  // A write can complete after the client was noticed leaving (the watch's error handled first): the connection is
  // closed by then, and reading the next request from it would fail as if that request were malformed.
  if (gone_) return;
  complete_ = true;
  end_exchange(true);
  if (watching_) {
    stream_.socket().cancel();  // on_watch then goes on with after_response
  } else {
    after_response();
  }
}

void Session::after_response() {
  if (!keep_alive_ || state_.stopping) return close();
  read_header();
}

void Session::send_error_and_close(int status, const std::string& message) {
  keep_alive_ = false;
  HttpResponse response = state_.render_error(status, message);
  state_.count_response(response.status);
  auto reply = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(response.status), 11);
  set_headers(*reply, response);
  reply->body() = std::move(response.body);
  reply->prepare_payload();
  stream_.expires_after(kLingerOnError);
  http::async_write(stream_, *reply, [self = shared_from_this(), reply](const beast::error_code& error, std::size_t) {
    if (error) return self->close();
    self->linger();
  });
}

void Session::linger() {
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream_.async_read_some(net::buffer(linger_buffer_),
                          [self = shared_from_this()](const beast::error_code& error, std::size_t) {
                            if (error) return self->close();
                            self->linger();
                          });
}

void Session::close() {
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
}

void accept_next(State& state) {
  state.acceptor.async_accept(net::make_strand(state.io), [&state](const beast::error_code& error, tcp::socket socket) {
    if (state.stopping) return;
    if (error) {
      // Out of descriptors (or another passing failure): say so, and try again shortly instead of spinning.
      static std::atomic<int64_t> last_warned{0};
      const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::steady_clock::now().time_since_epoch()).count();
      if (last_warned.exchange(now) != now) spdlog::warn("accepting a connection failed: {}", error.message());
      state.accept_retry.expires_after(kAcceptRetry);
      state.accept_retry.async_wait([&state](const beast::error_code& cancelled) {
        if (!cancelled) accept_next(state);
      });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::make_shared<Session>(std::move(socket), state)->start();
    accept_next(state);
  });
}

}  // namespace

HttpTransport::HttpTransport(HttpTransportOptions options, RequestHandler handler, ErrorRenderer render_error,
                             std::function<void(int status)> count_response)
    : state_(std::make_unique<State>(options)) {
  require(options.event_loop_threads >= 1, "the HTTP server needs at least one event-loop thread");
  state_->handler = std::move(handler);
  state_->render_error = std::move(render_error);
  state_->count_response = std::move(count_response);
}

HttpTransport::~HttpTransport() {
  stop();
  // Jobs not yet started are dropped; those running end first.
  state_->workers.stop();
  state_->workers.join();
}

int HttpTransport::bind(const std::string& host, int port) {
  beast::error_code error;
  const net::ip::address address = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, error);
  require(!error, "cannot listen on {}:{}: not an IP address of this host ({})", host, port, error.message());
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  tcp::acceptor& acceptor = state_->acceptor;
  acceptor.open(endpoint.protocol(), error);
  if (!error) acceptor.set_option(net::socket_base::reuse_address(true), error);
  if (!error) acceptor.bind(endpoint, error);
  if (!error) acceptor.listen(kListenBacklog, error);
  require(!error, "cannot listen on {}:{} ({})", host, port == 0 ? std::string("any port") : std::to_string(port),
          error.message());
  return acceptor.local_endpoint().port();
}

void HttpTransport::serve() {
  accept_next(*state_);
  std::vector<std::thread> threads;
  for (std::size_t t = 1; t < state_->options.event_loop_threads; ++t) {
    threads.emplace_back([this] { state_->io.run(); });
  }
  state_->io.run();
  for (std::thread& thread : threads) thread.join();
  beast::error_code ignored;
  state_->acceptor.close(ignored);
}

void HttpTransport::stop() {
  // Ends run() on every event-loop thread, and makes a later serve() return at once.
  state_->stopping = true;
  state_->io.stop();
}

void HttpTransport::run_on_worker(std::function<void()> job) { net::post(state_->workers, std::move(job)); }

}  // namespace beamline::server
