"""What a model needs from its checkpoint's config (ModelSpec, read by each
architecture), and what tensor parallelism must split evenly (TPSplit)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import NamedTuple

from engine.errors import InvalidInputError, ModelLoadError, UnsupportedModelError
from engine.model.layers.rotary import ROPE_TYPES
from engine.quant import QuantMethod


@dataclass(slots=True)
class ModelSpec:
    """Read by the architecture's spec_from_config (engine.model.registry), checked
    by engine.model.loader.read_model_spec before any weight is read."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    quant: QuantMethod | None = None  # None: dense
    eos_token_id: object = None  # int or list, from config.json
    sliding_window: int | None = None  # attention window; None: full attention
    # per layer "sliding_attention" / "full_attention"; None: every layer sliding when sliding_window is set
    layer_types: tuple[str, ...] | None = None
    rotary_dim: int | None = None  # rotated dims of a head (partial_rotary_factor); None: head_dim
    extra: dict = field(default_factory=dict)  # a family's own values (e.g. "moe", "gemma")

    def window(self, layer: int) -> int | None:
        """The attention window of a layer (None: full attention)."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def quant_group_size(self) -> int | None:
        """The quantization's group size (None: dense, or a method without groups)."""
        return getattr(self.quant, "group_size", None)


# config.json sizes a checkpoint may declare (name in the config, ModelSpec field, most): past
# them a config is malformed, and the buffers sized from it (rope caches) could not be allocated
SPEC_LIMITS = (("vocab_size", "vocab_size", 1 << 22), ("hidden_size", "hidden_size", 1 << 17),
               ("intermediate_size", "intermediate_size", 1 << 20), ("num_hidden_layers", "num_layers", 1 << 12),
               ("num_attention_heads", "num_heads", 1 << 12), ("num_key_value_heads", "num_kv_heads", 1 << 12),
               ("head_dim", "head_dim", 1 << 12), ("max_position_embeddings", "max_position_embeddings", 1 << 24))


def check_spec(spec: ModelSpec) -> None:
    """ModelLoadError naming the config.json field whose value is out of range."""
    for name, attr, most in SPEC_LIMITS:
        value = getattr(spec, attr)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ModelLoadError(f"config.json: {name}={value!r} is out of range (an integer in [1, {most}])")


def context_length(spec: ModelSpec, asked: int | None, allow_long: bool) -> int:
    """The engine's max_model_len: `asked`, or the model's positions (vLLM's derivation: times the
    rope factor for the scalings that do not write the extended length into the config). Asking
    for more positions than the model has fails InvalidInputError naming max_model_len, unless
    `allow_long` (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN): then a warning."""
    scaling = spec.rope_scaling or {}
    limit = spec.max_position_embeddings
    if scaling.get("rope_type") not in (None, "default", "longrope", "llama3") and scaling.get("factor"):
        if scaling["rope_type"] == "yarn":
            limit = int(scaling.get("original_max_position_embeddings") or limit)
        limit = int(limit * float(scaling["factor"]))
    if asked is None:
        return spec.max_position_embeddings
    if asked > limit:
        if not allow_long:
            raise InvalidInputError(f"max_model_len {asked} is more than the model's {limit} positions (config.json "
                                    "max_position_embeddings, with its rope scaling): outputs past them are "
                                    "garbage (allow_long_max_model_len=True runs it anyway)", field="max_model_len")
        logging.getLogger(__name__).warning("max_model_len %d is more than the model's %d positions: outputs past "
                                            "them may be garbage", asked, limit)
    return asked


class TPSplit(NamedTuple):
    """A linear split across tensor-parallel ranks: its checkpoint name, the features
    the split divides (a column split's outputs, a row split's inputs), the split."""

    name: str
    features: int
    split: str  # "column" | "row"


def rope_from_config(cfg, params: dict | None = None) -> tuple[float, dict | None]:
    """rope theta and scaling from transformers 5 (rope_parameters, or `params`: one
    layer type's entry of them) or 4 (rope_theta/rope_scaling); UnsupportedModelError
    for a rope type we lack."""
    params = params if params is not None else getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        scaling = dict(params)
        theta = float(scaling.pop("rope_theta"))
    else:
        theta = float(getattr(cfg, "rope_theta", 10000.0))
        scaling = getattr(cfg, "rope_scaling", None)
        if scaling:
            scaling = dict(scaling)
            scaling.setdefault("rope_type", scaling.get("type", "default"))
        scaling = scaling or None
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(f"rope scaling {rope_type!r} is not supported ({sorted(ROPE_TYPES)})")
    if scaling and rope_type in ("longrope", "yarn") and "original_max_position_embeddings" not in scaling:
        original = getattr(cfg, "original_max_position_embeddings", None)
        if original:
            scaling["original_max_position_embeddings"] = int(original)
    if scaling and rope_type == "default":
        scaling = None
    return theta, scaling


def partial_rotary_factor(cfg) -> float:
    """The fraction of a head's dims rotary rotates (rope_parameters' or the config's)."""
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and params.get("partial_rotary_factor") is not None:
        return float(params["partial_rotary_factor"])
    return float(getattr(cfg, "partial_rotary_factor", None) or 1.0)
