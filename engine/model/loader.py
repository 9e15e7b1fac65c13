"""Checkpoints: resolve a local folder or hub id, read and validate the
config (before any weight is read), and stream safetensors tensors."""
from __future__ import annotations

import glob
import json
import logging
import os

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.model.llama import ModelSpec

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}
SUPPORTED_ROPE_TYPES = {"default", "linear", "llama3"}
AWQ_GROUP_SIZES = (32, 64, 128)
HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def resolve_model_path(model: str, revision: str | None = None) -> str:
    """A local folder as is; otherwise a hub snapshot (HF_TOKEN, HF_HOME,
    HF_HUB_OFFLINE honoured by huggingface_hub), safetensors and configs only."""
    if os.path.isdir(model):
        return model
    if os.path.exists(model) or model.startswith((".", "/")):
        raise ModelLoadError(f"model path {model!r} is not a folder")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, revision=revision, allow_patterns=HUB_PATTERNS, token=os.environ.get("HF_TOKEN"))
    except Exception as exc:  # noqa: BLE001 - reported with its cause
        raise ModelLoadError(f"model {model!r} could not be fetched from the hub: {exc}") from exc


def _rope(cfg) -> tuple[float, dict | None]:
    """rope theta and scaling from transformers 5 (rope_parameters) or 4 (rope_theta/rope_scaling)."""
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        scaling = dict(params)
        theta = float(scaling.pop("rope_theta"))
        return theta, scaling
    theta = float(getattr(cfg, "rope_theta", 10000.0))
    scaling = getattr(cfg, "rope_scaling", None)
    if scaling:
        scaling = dict(scaling)
        scaling.setdefault("rope_type", scaling.get("type", "default"))
    return theta, scaling or None


def _quant_group_size(cfg) -> tuple[int | None, tuple[str, ...]]:
    q = getattr(cfg, "quantization_config", None)
    if not q:
        return None, ()
    q = q if isinstance(q, dict) else q.to_dict()
    method = str(q.get("quant_method", "")).lower()
    if method != "awq":
        raise UnsupportedModelError(f"quantization method {method!r} is not supported (only AWQ)")
    bits, group = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size"))
    version = str(q.get("version", "gemm")).lower()
    if bits != 4:
        raise UnsupportedModelError(f"AWQ with {bits} bits is not supported (only 4)")
    if group not in AWQ_GROUP_SIZES:
        raise UnsupportedModelError(f"AWQ group size {group} is not supported ({AWQ_GROUP_SIZES})")
    if version != "gemm":
        raise UnsupportedModelError(f"AWQ version {version!r} is not supported (only GEMM)")
    if not q.get("zero_point", True):
        raise UnsupportedModelError("AWQ without zero point is not supported")
    return int(group), tuple(q.get("modules_to_not_convert") or ())


def read_model_spec(path: str, max_model_len: int | None = None, quantization: str | None = None) -> ModelSpec:
    """Validate the checkpoint's config; raises UnsupportedModelError naming what is unsupported."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"config.json at {path!r} could not be read: {exc}") from exc
    archs = list(getattr(cfg, "architectures", None) or [])
    if not archs or archs[0] not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"architecture {archs[0] if archs else None!r} is not supported ({sorted(SUPPORTED_ARCHITECTURES)})"
        )
    theta, scaling = _rope(cfg)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(f"rope scaling {rope_type!r} is not supported ({sorted(SUPPORTED_ROPE_TYPES)})")
    if scaling and rope_type == "default" and len(scaling) > 1:
        scaling = None
    max_pos = int(getattr(cfg, "max_position_embeddings", 4096))
    want_len = max_model_len or max_pos
    window = getattr(cfg, "sliding_window", None)
    if archs[0] == "Qwen2ForCausalLM" and not getattr(cfg, "use_sliding_window", False):
        window = None
    if window is not None and window < want_len:
        raise UnsupportedModelError(
            f"sliding window {window} is shorter than max_model_len {want_len}; sliding-window attention is not supported"
        )
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"activation {cfg.hidden_act!r} is not supported (silu)")
    group, skip = _quant_group_size(cfg)
    if quantization == "awq" and group is None:
        raise UnsupportedModelError("QUANTIZATION=awq but the checkpoint has no AWQ quantization_config")
    if quantization == "none" and group is not None:
        raise UnsupportedModelError("quantization 'none' asked, but the checkpoint is AWQ-quantized")
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return ModelSpec(
        architecture=archs[0],
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.rms_norm_eps),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        attention_bias=archs[0] == "Qwen2ForCausalLM" or bool(getattr(cfg, "attention_bias", False)),
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        quant_group_size=group,
        modules_not_quantized=skip,
        eos_token_id=getattr(cfg, "eos_token_id", None),
    )


def safetensors_files(path: str) -> list[str]:
    """The checkpoint's safetensors files (via the shard index when present);
    pickle checkpoints are refused."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(path, s) for s in shards]
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise ModelLoadError(f"shard index names missing files: {missing[:3]}")
        return files
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        return files
    pickles = [os.path.basename(p) for ext in ("*.bin", "*.pt", "*.pth", "*.ckpt") for p in glob.glob(os.path.join(path, ext))]
    if pickles:
        raise ModelLoadError(
            f"only pickle checkpoints found ({pickles[:3]}); they are refused because loading them can run code. "
            "Convert the model to safetensors."
        )
    raise ModelLoadError(f"no *.safetensors weights in {path!r}")


def iter_weights(files: list[str], device: str = "cpu"):
    from safetensors import safe_open

    for file in files:
        try:
            with safe_open(file, framework="pt", device=device) as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except ModelLoadError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"{os.path.basename(file)} could not be read: {exc}") from exc


def eos_token_ids(path: str, cfg_eos, tokenizer) -> set[int]:
    ids: set[int] = set()
    for value in (cfg_eos, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen):
        with open(gen) as f:
            value = json.load(f).get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids
