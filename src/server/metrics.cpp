#include "server/metrics.h"

#include <fmt/format.h>

namespace beamline::server {

namespace {

class MetricsWriter {
 public:
  MetricsWriter(const std::string& model_name, const std::vector<EngineStats>& engines)
      : model_label_("model_name=\"" + escape_label_value(model_name) + "\""), engines_(engines) {}

  void header(const std::string& name, const char* type, const std::string& help) {
    text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }

  void sample(const std::string& name, double value, const std::string& extra_labels = "") {
    const std::string labels = extra_labels.empty() ? model_label_ : model_label_ + "," + extra_labels;
    text_ += fmt::format("{}{{{}}} {}\n", name, labels, format_value(value));
  }

  void gauge(const std::string& name, const std::string& help, double value) {
    header(name, "gauge", help);
    sample(name, value);
  }

  // One sample per engine, labelled engine="i" as vLLM labels each data-parallel engine's metrics; `value` reads it
  // from the engine's stats.
  template <typename Read>
  void per_engine(const std::string& name, const char* type, const std::string& help, Read value) {
    header(name, type, help);
    for (std::size_t e = 0; e < engines_.size(); ++e) sample(name, static_cast<double>(value(engines_[e])), engine(e));
  }

  void histogram(const std::string& name, const std::string& help, Histogram EngineStats::*member) {
    header(name, "histogram", help);
    for (std::size_t e = 0; e < engines_.size(); ++e) {
      const Histogram& histogram = engines_[e].*member;
      uint64_t cumulative = 0;
      for (std::size_t i = 0; i < histogram.counts.size(); ++i) {
        cumulative += histogram.counts[i];
        const std::string bound = i < histogram.bounds.size() ? format_value(histogram.bounds[i]) : "+Inf";
        sample(name + "_bucket", static_cast<double>(cumulative), engine(e) + ",le=\"" + bound + "\"");
      }
      sample(name + "_sum", histogram.sum, engine(e));
      sample(name + "_count", static_cast<double>(histogram.count), engine(e));
    }
  }

  static std::string engine(std::size_t index) { return fmt::format("engine=\"{}\"", index); }
  std::string take() { return std::move(text_); }

 private:
  static std::string format_value(double value) { return fmt::format("{}", value); }

  std::string model_label_;
  const std::vector<EngineStats>& engines_;
  std::string text_;
};

}  // namespace

void HttpCounters::count_response(int status) {
  std::lock_guard lock(mutex_);
  ++by_status_[status];
}

std::map<int, uint64_t> HttpCounters::responses_by_status() const {
  std::lock_guard lock(mutex_);
  return by_status_;
}

std::string escape_label_value(const std::string& value) {
  std::string escaped;
  for (char c : value) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '"') {
      escaped += "\\\"";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

std::string render_metrics(const std::vector<EngineStats>& engines, const std::map<int, uint64_t>& responses_by_status,
                           int64_t active_streams, const std::string& model_name) {
  MetricsWriter out(model_name, engines);
  using S = const EngineStats&;
  out.per_engine("vllm:num_requests_running", "gauge", "Number of sequences in the running set.",
                 [](S s) { return s.num_running; });
  out.per_engine("vllm:num_requests_waiting", "gauge", "Number of sequences waiting to be scheduled (new or preempted).",
                 [](S s) { return s.num_waiting; });
  out.per_engine("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage: fraction of the pool's blocks referenced (1 = full).",
                 [](S s) { return s.kv_cache_usage; });
  out.per_engine("vllm:prompt_tokens_total", "counter", "Prompt tokens processed.",
                 [](S s) { return s.prompt_tokens_total; });
  out.per_engine("vllm:generation_tokens_total", "counter", "Tokens generated.",
                 [](S s) { return s.generation_tokens_total; });
  out.per_engine("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
                 [](S s) { return s.prefix_cache_queries_total; });
  out.per_engine("vllm:prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.",
                 [](S s) { return s.prefix_cache_hits_total; });
  out.per_engine("vllm:num_preemptions_total", "counter", "Sequences preempted (blocks freed, recomputed later).",
                 [](S s) { return s.preemptions_total; });

  if (!engines.front().spec_decode_num_accepted_tokens_per_pos.empty()) {  // speculative decoding is on
    out.per_engine("vllm:spec_decode_num_drafts_total", "counter", "Draft proposals verified (one per sequence and step).",
                   [](S s) { return s.spec_decode_num_drafts_total; });
    out.per_engine("vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.",
                   [](S s) { return s.spec_decode_num_draft_tokens_total; });
    out.per_engine("vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
                   [](S s) { return s.spec_decode_num_accepted_tokens_total; });
    const std::string per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
    out.header(per_pos, "counter", "Draft tokens accepted, by position in the draft.");
    for (std::size_t e = 0; e < engines.size(); ++e) {
      const std::vector<uint64_t>& accepted = engines[e].spec_decode_num_accepted_tokens_per_pos;
      for (std::size_t i = 0; i < accepted.size(); ++i)
        out.sample(per_pos, static_cast<double>(accepted[i]), MetricsWriter::engine(e) + fmt::format(",position=\"{}\"", i));
    }
  }

  const std::string success = "vllm:request_success_total";
  out.header(success, "counter", "Finished requests by finish reason.");
  for (std::size_t e = 0; e < engines.size(); ++e) {
    const EngineStats& stats = engines[e];
    const std::string engine = MetricsWriter::engine(e);
    out.sample(success, static_cast<double>(stats.requests_stopped), engine + ",finished_reason=\"stop\"");
    out.sample(success, static_cast<double>(stats.requests_length), engine + ",finished_reason=\"length\"");
    out.sample(success, static_cast<double>(stats.requests_aborted), engine + ",finished_reason=\"abort\"");
  }

  out.histogram("vllm:time_to_first_token_seconds", "Time to first token (arrival to first sampled token).",
                &EngineStats::time_to_first_token);
  out.histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a sequence.",
                &EngineStats::inter_token_latency);
  out.histogram("vllm:time_per_output_token_seconds",
                "Time per output token after the first (the same observations as vllm:inter_token_latency_seconds).",
                &EngineStats::inter_token_latency);
  out.histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", &EngineStats::e2e_request_latency);
  out.histogram("vllm:request_queue_time_seconds", "Time from arrival to first scheduling.",
                &EngineStats::request_queue_time);

  out.per_engine("beamline:kv_cache_hybrid_saved_bytes", "gauge",
                 "KV bytes the hybrid layout saves now, over running sequences, against keeping every layer's KV "
                 "(sliding-window layers free blocks that left the window).",
                 [](S s) { return s.kv_hybrid_saved_bytes; });
  out.per_engine("beamline:kv_cache_hybrid_saved_bytes_finished_total", "counter",
                 "KV bytes the hybrid layout had saved for each finished sequence at its end, summed.",
                 [](S s) { return s.kv_hybrid_saved_bytes_finished_total; });
  out.per_engine("beamline:kv_cache_blocks_total", "gauge", "Blocks in the KV pool.",
                 [](S s) { return s.kv_blocks_total; });
  out.per_engine("beamline:kv_cache_blocks_free", "gauge", "Free KV blocks (including cached but unreferenced ones).",
                 [](S s) { return s.kv_blocks_free; });
  out.per_engine("beamline:kv_cache_bytes", "gauge", "Bytes of the KV pool.", [](S s) { return s.kv_cache_bytes; });
  out.per_engine("beamline:kv_cache_token_capacity", "gauge", "Token positions of full-attention KV the pool holds.",
                 [](S s) { return s.kv_token_capacity; });
  out.per_engine("beamline:request_failed_total", "counter", "Requests that ended with an engine error.",
                 [](S s) { return s.requests_failed; });
  out.per_engine("beamline:jump_forward_draft_tokens_total", "counter",
                 "Structured outputs: grammar-forced tokens proposed as drafts (--jump-forward).",
                 [](S s) { return s.jump_forward_draft_tokens_total; });
  out.per_engine("beamline:jump_forward_accepted_tokens_total", "counter",
                 "Grammar-forced draft tokens the model confirmed.",
                 [](S s) { return s.jump_forward_accepted_tokens_total; });
  out.per_engine("beamline:engine_steps_total", "counter", "Engine steps (batched forward passes).",
                 [](S s) { return s.steps_total; });
  out.gauge("beamline:http_streams_active", "Streaming responses in progress.", static_cast<double>(active_streams));
  const std::string responses = "beamline:http_responses_total";
  out.header(responses, "counter", "HTTP responses by status code.");
  for (const auto& [status, count] : responses_by_status) {
    out.sample(responses, static_cast<double>(count), fmt::format("code=\"{}\"", status));
  }
  return out.take();
}

}  // namespace beamline::server
