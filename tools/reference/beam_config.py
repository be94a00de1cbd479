"""config.json of a Beam checkpoint (docs/model-format.md §2): load, validate, fill defaults. Pure Python."""
import json
import math

REQUIRED_INT = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "moe_intermediate_size", "first_k_dense_replace",
                "n_routed_experts", "num_experts_per_tok"]


class BeamConfig:
    def __init__(self, data, source="config.json"):
        self.raw = dict(data)

        def get(key, kind, default=None):
            if key not in data:
                if default is None:
                    raise ValueError(f"{source}: missing key {key}")
                return default
            value = data[key]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"{source}: key {key} must be {kind.__name__}, found {value!r}")
            return value

        for key in REQUIRED_INT:
            setattr(self, key, get(key, int))
        self.n_group = get("n_group", int, 1)
        self.topk_group = get("topk_group", int, 1)
        self.norm_topk_prob = get("norm_topk_prob", bool, True)
        self.routed_scaling_factor = get("routed_scaling_factor", float, 1.0)
        self.sliding_window = get("sliding_window", int)
        self.rope_theta = get("rope_theta", float, 10000.0)
        self.ssmax_base = get("ssmax_base", float, 2048.0)
        self.ssmax_exponent = get("ssmax_exponent", float, 0.1)
        self.rms_norm_eps = get("rms_norm_eps", float, 1e-6)
        self.residual_scale = get("residual_scale", float, 1.0 / math.sqrt(2 * self.num_hidden_layers))
        self.final_logit_softcapping = get("final_logit_softcapping", float, 30.0)
        if get("scoring_func", str, "sigmoid") != "sigmoid" or get("topk_method", str, "noaux_tc") != "noaux_tc":
            raise ValueError(f"{source}: only scoring_func sigmoid / topk_method noaux_tc are defined")
        if get("tie_word_embeddings", bool, False):
            raise ValueError(f"{source}: tie_word_embeddings must be false for Beam")
        if "layer_types" in data:
            self.layer_types = data["layer_types"]
            if not isinstance(self.layer_types, list) or len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(f"{source}: layer_types must list num_hidden_layers={self.num_hidden_layers} entries")
            for entry in self.layer_types:
                if entry not in ("sliding_attention", "full_attention"):
                    raise ValueError(f"{source}: layer_types entry {entry!r} is neither sliding_attention "
                                     f"nor full_attention")
        else:
            every = get("global_attention_every", int, 6)
            last = self.num_hidden_layers - 1
            self.layer_types = ["full_attention" if (i % every == every - 1 or i == last) else "sliding_attention"
                                for i in range(self.num_hidden_layers)]
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{source}: num_attention_heads not divisible by num_key_value_heads")
        if self.n_routed_experts % self.n_group:
            raise ValueError(f"{source}: n_routed_experts % n_group != 0")
        if self.topk_group > self.n_group:
            raise ValueError(f"{source}: topk_group > n_group")
        if self.num_experts_per_tok > self.topk_group * self.n_routed_experts // self.n_group:
            raise ValueError(f"{source}: num_experts_per_tok > topk_group * experts per group")
        if self.head_dim % 2:
            raise ValueError(f"{source}: head_dim must be even for RoPE")

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls(json.load(f), source=str(path))

    def is_moe(self, layer):
        return layer >= self.first_k_dense_replace

    def is_sliding(self, layer):
        return self.layer_types[layer] == "sliding_attention"


def nano_config(vocab_size, bos_id, eos_ids, pad_id):
    """beam-nano (v2): every Beam feature, about 28 M parameters (57 MB in BF16)."""
    layers = 8
    return _nano(vocab_size, bos_id, eos_ids, pad_id, layers, 1536, 192, (2, 5, 7))


def nano3_config(vocab_size, bos_id, eos_ids, pad_id):
    """beam-nano v3: v2 two layers deeper (10: 2 dense, 8 MoE of 8 experts x 144), full SSMax layers 3, 6, 9;
    29.6 M parameters (59 MB in BF16: what one device call can bring back, 64 MiB in all), 17 M active per token."""
    return _nano(vocab_size, bos_id, eos_ids, pad_id, 10, 1536, 144, (3, 6, 9))


def smoke_config(vocab_size, bos_id, eos_ids, pad_id):
    """The v3 layout shrunk for CPU smoke tests of the training pipeline (hidden 64, 4 layers, 0.6 M parameters)."""
    return _nano(vocab_size, bos_id, eos_ids, pad_id, 4, 128, 32, (1, 3), hidden=64, heads=4, head_dim=16)


CONFIGS = {"v2": nano_config, "v3": nano3_config, "smoke": smoke_config}


def _nano(vocab_size, bos_id, eos_ids, pad_id, layers, intermediate, moe_intermediate, full_layers, hidden=512,
          heads=8, head_dim=64):
    return {
        "architectures": ["BeamForCausalLM"],
        "model_type": "beam",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "moe_intermediate_size": moe_intermediate,
        "first_k_dense_replace": 2,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "layer_types": ["full_attention" if i in full_layers else "sliding_attention" for i in range(layers)],
        "sliding_window": 128,
        "rope_theta": 10000.0,
        "ssmax_base": 512.0,
        "ssmax_exponent": 0.1,
        "rms_norm_eps": 1e-6,
        "residual_scale": 1.0 / math.sqrt(2 * layers),
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "pad_token_id": pad_id,
        "torch_dtype": "bfloat16",
    }
