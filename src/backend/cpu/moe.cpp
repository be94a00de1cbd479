// The FP32 noaux_tc router, routed experts and the dense SwiGLU MLP on the CPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/projection.h"
#include "backend/op_checks.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace beamline {
namespace {

// The `count` indices of the largest values, largest first; equal values go to the lower index.
std::vector<int32_t> top_indices(const std::vector<float>& values, int32_t count) {
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  order.resize(static_cast<std::size_t>(count));
  return order;
}

// The LoRA adapters of a SwiGLU's rows (SwigluLora): each row's table entry, -1 for none.
struct RowLora {
  const SwigluLora* lora = nullptr;
  const int32_t* entries = nullptr;
};

void add_lora(const LoraTable& table, const float* x, int64_t rows, const RowLora& row_lora, float* y, int64_t out) {
  if (row_lora.lora != nullptr && table.defined()) cpu::lora_table_rows(x, rows, table, row_lora.entries, y, out);
}

// SwiGLU over `rows` rows of x into y: y = down(silu(gate(x)) * up(x)), each projection with its rows' LoRA.
void swiglu_rows(const float* x, int64_t rows, const SwigluTensors& mlp, float* y, const RowLora& row_lora = {}) {
  const int64_t intermediate = mlp.gate.out_features(), hidden = mlp.down.out_features();
  std::vector<float> gate(static_cast<std::size_t>(rows * intermediate)), up(gate.size());
  cpu::matmul_wt(x, rows, mlp.gate, gate.data(), intermediate);
  cpu::matmul_wt(x, rows, mlp.up, up.data(), intermediate);
  if (row_lora.lora != nullptr) {
    add_lora(row_lora.lora->gate, x, rows, row_lora, gate.data(), intermediate);
    add_lora(row_lora.lora->up, x, rows, row_lora, up.data(), intermediate);
  }
  for (std::size_t i = 0; i < gate.size(); ++i) gate[i] = cpu::silu(gate[i]) * up[i];
  cpu::matmul_wt(gate.data(), rows, mlp.down, y, hidden);
  if (row_lora.lora != nullptr) add_lora(row_lora.lora->down, gate.data(), rows, row_lora, y, hidden);
}

void check_swiglu(const SwigluTensors& mlp, int64_t hidden, std::string_view op) {
  const cpu::Projection gate = cpu::projection(mlp.gate, op, "gate"), up = cpu::projection(mlp.up, op, "up"),
                        down = cpu::projection(mlp.down, op, "down");
  const int64_t intermediate = gate.out;
  const auto require_matrix = [&](const cpu::Projection& found, int64_t out, int64_t in, std::string_view what) {
    require(found.out == out && found.in == in, "{}: {} is [{}, {}] (as dequantized), expected [{}, {}]", op, what,
            found.out, found.in, out, in);
  };
  require_matrix(gate, intermediate, hidden, "gate");
  require_matrix(up, intermediate, hidden, "up");
  require_matrix(down, hidden, intermediate, "down");
}

}  // namespace

void CpuBackend::route(const Tensor& h, const Tensor& router, const Tensor& bias, const RouterParams& params,
                       Tensor& expert_ids, Tensor& expert_weights) {
  const int64_t rows = h.dim(0), hidden = h.dim(1), experts = router.dim(0);
  check_route_args(h, router, bias, params, expert_ids, expert_weights);
  const int64_t group_size = experts / params.n_group;

  ThreadPool::global().parallel_for(static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    std::vector<float> score(static_cast<std::size_t>(experts)), choice(score.size()),
        group_score(static_cast<std::size_t>(params.n_group));
    for (auto t = static_cast<int64_t>(begin); t < static_cast<int64_t>(end); ++t) {
      const float* x = h.data<const float>() + t * hidden;
      for (int64_t e = 0; e < experts; ++e) {
        const float logit = cpu::dot(x, router.data<const float>() + e * hidden, hidden);
        score[e] = 1.0f / (1.0f + std::exp(-logit));
        choice[e] = score[e] + bias.data<const float>()[e];
      }
      for (int32_t g = 0; g < params.n_group; ++g) {
        std::vector<float> members(choice.begin() + g * group_size, choice.begin() + (g + 1) * group_size);
        float sum = 0.0f;
        for (int32_t index : top_indices(members, static_cast<int32_t>(std::min<int64_t>(2, group_size))))
          sum += members[index];
        group_score[g] = sum;
      }
      std::vector<bool> kept(static_cast<std::size_t>(params.n_group), false);
      for (int32_t g : top_indices(group_score, params.topk_group)) kept[g] = true;
      for (int64_t e = 0; e < experts; ++e)
        if (!kept[e / group_size]) choice[e] = -std::numeric_limits<float>::infinity();
      const std::vector<int32_t> selected = top_indices(choice, params.top_k);
      float total = 0.0f;
      for (int32_t e : selected) total += score[e];
      int32_t* ids = expert_ids.data<int32_t>() + t * params.top_k;
      float* weights = expert_weights.data<float>() + t * params.top_k;
      for (int32_t j = 0; j < params.top_k; ++j) {
        const float weight = params.norm_topk_prob ? score[selected[j]] / total : score[selected[j]];
        ids[j] = selected[j];
        weights[j] = weight * params.routed_scaling_factor;
      }
    }
  });
}

static void moe_rows(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights, const MoeTensors& moe,
              const SwigluLora* lora, Tensor& out) {
  const int64_t rows = h.dim(0), hidden = h.dim(1), top_k = expert_ids.dim(1);
  const auto experts = static_cast<int64_t>(moe.experts.size());
  require_shape(expert_ids, {rows, top_k}, "moe", "expert_ids");
  require_shape(expert_weights, {rows, top_k}, "moe", "expert_weights");
  require_shape(out, h.shape(), "moe", "out");

  // Rows of (token, j) per expert, in token order.
  std::vector<std::vector<int64_t>> assigned(static_cast<std::size_t>(experts));
  for (int64_t slot = 0; slot < rows * top_k; ++slot) {
    const int32_t e = expert_ids.data<const int32_t>()[slot];
    require(e >= 0 && e < experts, "moe: expert id {} at row {} outside the {} experts", e, slot / top_k, experts);
    assigned[e].push_back(slot);
  }
  std::vector<int32_t> active;
  for (int64_t e = 0; e < experts; ++e)
    if (!assigned[e].empty()) {
      check_swiglu(moe.experts[e], hidden, "moe");
      active.push_back(static_cast<int32_t>(e));
    }

  // Each (token, j) gets its own output row, summed in j order afterwards, so results never depend on batching.
  std::vector<float> contributions(static_cast<std::size_t>(rows * top_k * hidden));
  auto run_expert = [&](int32_t e) {
    const auto& slots = assigned[e];
    const auto count = static_cast<int64_t>(slots.size());
    std::vector<float> x(static_cast<std::size_t>(count * hidden)), y(x.size());
    for (int64_t i = 0; i < count; ++i)
      std::copy_n(h.data<const float>() + slots[i] / top_k * hidden, hidden, x.data() + i * hidden);
    std::vector<int32_t> entries;
    RowLora row_lora;
    if (lora != nullptr) {
      // Token t's rows through expert e read entry slot * experts + e.
      for (int64_t i = 0; i < count; ++i) {
        const int32_t slot = lora->row_adapters.data<const int32_t>()[slots[i] / top_k];
        entries.push_back(slot < 0 ? -1 : slot * static_cast<int32_t>(experts) + e);
      }
      row_lora = {lora, entries.data()};
    }
    swiglu_rows(x.data(), count, moe.experts[e], y.data(), row_lora);
    for (int64_t i = 0; i < count; ++i)
      std::copy_n(y.data() + i * hidden, hidden, contributions.data() + slots[i] * hidden);
  };
  // Many experts: one per task. Few: one after another, each spreading its matrix products over the threads.
  if (active.size() >= ThreadPool::global().size()) {
    ThreadPool::global().parallel_for(active.size(), [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) run_expert(active[i]);
    });
  } else {
    for (int32_t e : active) run_expert(e);
  }
  for (int64_t t = 0; t < rows; ++t) {
    float* o = out.data<float>() + t * hidden;
    std::fill_n(o, hidden, 0.0f);
    for (int64_t j = 0; j < top_k; ++j) {
      const float weight = expert_weights.data<const float>()[t * top_k + j];
      const float* c = contributions.data() + (t * top_k + j) * hidden;
      for (int64_t i = 0; i < hidden; ++i) o[i] += weight * c[i];
    }
  }
}

void CpuBackend::moe(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights, const MoeTensors& moe,
                     Tensor& out) {
  moe_rows(h, expert_ids, expert_weights, moe, nullptr, out);
}

void CpuBackend::moe_lora(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights,
                          const MoeTensors& moe, const SwigluLora& lora, Tensor& out) {
  check_moe_lora_args(h, moe, lora);
  moe_rows(h, expert_ids, expert_weights, moe, &lora, out);
}

void CpuBackend::lora(const Tensor& x, const LoraTensors& lora, const Tensor& indices, Tensor& y) {
  check_lora_args(x, lora, indices, y);
  cpu::lora_rows(x.data<const float>(), x.dim(0), lora, indices.data<const int32_t>(), y.data<float>(), y.dim(1));
}

void CpuBackend::swiglu(const Tensor& h, const SwigluTensors& mlp, Tensor& out) {
  const int64_t rows = h.dim(0), hidden = h.dim(1);
  check_swiglu(mlp, hidden, "swiglu");
  require_shape(out, h.shape(), "swiglu", "out");
  swiglu_rows(h.data<const float>(), rows, mlp, out.data<float>());
}

}  // namespace beamline
