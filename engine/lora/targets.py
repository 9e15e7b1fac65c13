"""Which of the model's linears an adapter may change, and where a PEFT module name lands:
PEFT names the checkpoint's projections (model.layers.0.self_attn.q_proj); the model merges
some into one linear (q/k/v into qkv_proj as shards 0-2, gate/up into gate_up_proj), which
engine.model.loader's routing knows. Targets: the decoder layers' attention and MLP linears;
not the embeddings, the LM head, a MoE router or its experts."""
from __future__ import annotations

from engine.model.layers.linear import FUSED, Linear
from engine.model.loader import default_route

TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class LoRATargets:
    """The model's target linears by name, and the routing of PEFT module names onto them."""

    def __init__(self, model):
        self.model = model
        self.linears: dict[str, Linear] = {
            name: m for name, m in model.named_modules()
            if isinstance(m, Linear) and name.rpartition(".")[2] in TARGETS and ".experts" not in name}
        self._route = getattr(model, "route_weight", None)

    def find(self, module: str) -> tuple[str, object] | None:
        """(our linear's name, shard) of a PEFT module name (FUSED: the checkpoint's own merged
        projection, e.g. Phi-3's qkv_proj), or None when it is not a target."""
        key = self.model.checkpoint_name(f"{module}.weight")
        if key is None:
            return None
        routed = (self._route(key) if self._route else None) or default_route(self.model, key)
        name, shard, _ = routed
        if name not in self.linears:
            return None
        return name, shard

    def shape(self, target: tuple[str, object]) -> tuple[int, int]:
        """(inputs, outputs) the adapter's pair must have for this target."""
        name, shard = target
        linear = self.linears[name]
        out = sum(linear.output_sizes) if shard == FUSED else linear.output_sizes[shard]
        return linear.in_features, out

    def describe(self) -> str:
        return "targets: q/k/v/o and gate/up/down projections of the decoder layers"
