"""What a model needs from its checkpoint's config (ModelSpec, read by each
architecture), and what tensor parallelism must split evenly (TPSplit)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from engine.errors import UnsupportedModelError
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

    @property
    def quant_group_size(self) -> int | None:
        """The quantization's group size (None: dense, or a method without groups)."""
        return getattr(self.quant, "group_size", None)


class TPSplit(NamedTuple):
    """A linear split across tensor-parallel ranks: its checkpoint name, the features
    the split divides (a column split's outputs, a row split's inputs), the split."""

    name: str
    features: int
    split: str  # "column" | "row"


def rope_from_config(cfg) -> tuple[float, dict | None]:
    """rope theta and scaling from transformers 5 (rope_parameters) or 4
    (rope_theta/rope_scaling); UnsupportedModelError for a rope type we lack."""
    params = getattr(cfg, "rope_parameters", None)
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
    if scaling and rope_type == "default" and len(scaling) > 1:
        scaling = None
    return theta, scaling
