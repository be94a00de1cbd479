#include "server/metrics.h"

#include <fmt/format.h>

namespace beamline::server {

namespace {

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& model_name)
      : model_label_("model_name=\"" + escape_label_value(model_name) + "\"") {}

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

  void counter(const std::string& name, const std::string& help, double value) {
    header(name, "counter", help);
    sample(name, value);
  }

  void histogram(const std::string& name, const std::string& help, const Histogram& histogram) {
    header(name, "histogram", help);
    uint64_t cumulative = 0;
    for (std::size_t i = 0; i < histogram.counts.size(); ++i) {
      cumulative += histogram.counts[i];
      const std::string bound = i < histogram.bounds.size() ? format_value(histogram.bounds[i]) : "+Inf";
      sample(name + "_bucket", static_cast<double>(cumulative), "le=\"" + bound + "\"");
    }
    sample(name + "_sum", histogram.sum);
    sample(name + "_count", static_cast<double>(histogram.count));
  }

  std::string take() { return std::move(text_); }

 private:
  static std::string format_value(double value) { return fmt::format("{}", value); }

  std::string model_label_;
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

std::string render_metrics(const EngineStats& stats, const std::map<int, uint64_t>& responses_by_status,
                           int64_t active_streams, const std::string& model_name) {
  MetricsWriter out(model_name);
  out.gauge("vllm:num_requests_running", "Number of sequences in the running set.", stats.num_running);
  out.gauge("vllm:num_requests_waiting", "Number of sequences waiting to be scheduled (new or preempted).",
            stats.num_waiting);
  out.gauge("vllm:kv_cache_usage_perc", "KV-cache usage: fraction of the pool's blocks referenced (1 = full).",
            stats.kv_cache_usage);
  out.counter("vllm:prompt_tokens_total", "Prompt tokens processed.", static_cast<double>(stats.prompt_tokens_total));
  out.counter("vllm:generation_tokens_total", "Tokens generated.", static_cast<double>(stats.generation_tokens_total));
  out.counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
              static_cast<double>(stats.prefix_cache_queries_total));
  out.counter("vllm:prefix_cache_hits_total", "Prompt tokens served from the prefix cache.",
              static_cast<double>(stats.prefix_cache_hits_total));
  out.counter("vllm:num_preemptions_total", "Sequences preempted (blocks freed, recomputed later).",
              static_cast<double>(stats.preemptions_total));

  if (!stats.spec_decode_num_accepted_tokens_per_pos.empty()) {  // speculative decoding is on
    out.counter("vllm:spec_decode_num_drafts_total", "Draft proposals verified (one per sequence and step).",
                static_cast<double>(stats.spec_decode_num_drafts_total));
    out.counter("vllm:spec_decode_num_draft_tokens_total", "Draft tokens verified.",
                static_cast<double>(stats.spec_decode_num_draft_tokens_total));
    out.counter("vllm:spec_decode_num_accepted_tokens_total", "Draft tokens accepted.",
                static_cast<double>(stats.spec_decode_num_accepted_tokens_total));
    const std::string per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
    out.header(per_pos, "counter", "Draft tokens accepted, by position in the draft.");
    for (std::size_t i = 0; i < stats.spec_decode_num_accepted_tokens_per_pos.size(); ++i)
      out.sample(per_pos, static_cast<double>(stats.spec_decode_num_accepted_tokens_per_pos[i]),
                 fmt::format("position=\"{}\"", i));
  }

  const std::string success = "vllm:request_success_total";
  out.header(success, "counter", "Finished requests by finish reason.");
  out.sample(success, static_cast<double>(stats.requests_stopped), "finished_reason=\"stop\"");
  out.sample(success, static_cast<double>(stats.requests_length), "finished_reason=\"length\"");
  out.sample(success, static_cast<double>(stats.requests_aborted), "finished_reason=\"abort\"");

  out.histogram("vllm:time_to_first_token_seconds", "Time to first token (arrival to first sampled token).",
                stats.time_to_first_token);
  out.histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a sequence.",
                stats.inter_token_latency);
  out.histogram("vllm:time_per_output_token_seconds",
                "Time per output token after the first (the same observations as vllm:inter_token_latency_seconds).",
                stats.inter_token_latency);
  out.histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", stats.e2e_request_latency);
  out.histogram("vllm:request_queue_time_seconds", "Time from arrival to first scheduling.", stats.request_queue_time);

  out.gauge("beamline:kv_cache_hybrid_saved_bytes",
            "KV bytes the hybrid layout saves now, over running sequences, against keeping every layer's KV "
            "(sliding-window layers free blocks that left the window).",
            static_cast<double>(stats.kv_hybrid_saved_bytes));
  out.counter("beamline:kv_cache_hybrid_saved_bytes_finished_total",
              "KV bytes the hybrid layout had saved for each finished sequence at its end, summed.",
              static_cast<double>(stats.kv_hybrid_saved_bytes_finished_total));
  out.gauge("beamline:kv_cache_blocks_total", "Blocks in the KV pool.", stats.kv_blocks_total);
  out.gauge("beamline:kv_cache_blocks_free", "Free KV blocks (including cached but unreferenced ones).",
            stats.kv_blocks_free);
  out.gauge("beamline:kv_cache_bytes", "Bytes of the KV pool.", static_cast<double>(stats.kv_cache_bytes));
  out.gauge("beamline:kv_cache_token_capacity", "Token positions of full-attention KV the pool holds.",
            static_cast<double>(stats.kv_token_capacity));
  out.counter("beamline:request_failed_total", "Requests that ended with an engine error.",
              static_cast<double>(stats.requests_failed));
  out.counter("beamline:jump_forward_draft_tokens_total",
              "Structured outputs: grammar-forced tokens proposed as drafts (--jump-forward).",
              static_cast<double>(stats.jump_forward_draft_tokens_total));
  out.counter("beamline:jump_forward_accepted_tokens_total", "Grammar-forced draft tokens the model confirmed.",
              static_cast<double>(stats.jump_forward_accepted_tokens_total));
  out.counter("beamline:engine_steps_total", "Engine steps (batched forward passes).",
              static_cast<double>(stats.steps_total));
  out.gauge("beamline:http_streams_active", "Streaming responses in progress.", static_cast<double>(active_streams));
  const std::string responses = "beamline:http_responses_total";
  out.header(responses, "counter", "HTTP responses by status code.");
  for (const auto& [status, count] : responses_by_status) {
    out.sample(responses, static_cast<double>(count), fmt::format("code=\"{}\"", status));
  }
  return out.take();
}

}  // namespace beamline::server
