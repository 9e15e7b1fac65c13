"""The generic loader: a checkpoint's files (local or hub; safetensors only), its config
checked before any weight is read, its model built and filled by its name mapping."""
from __future__ import annotations

import glob
import json
import os

import torch

import llm_kernels
from engine.distributed import SINGLE, TPGroup
from engine.errors import ModelLoadError
from engine.model import registry
from engine.model.spec import ModelSpec, check_spec
from engine.quant import quant_from_config

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
    """(name, tensor) of every tensor of the files, one file open at a time."""
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
    """The ids that end generation: config.json's, the tokenizer's, generation_config.json's."""
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


def read_model_spec(path: str, quantization: str | None = None) -> ModelSpec:
    """Validate the checkpoint's config; raises UnsupportedModelError naming what is unsupported."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"config.json at {path!r} could not be read: {exc}") from exc
    archs = list(getattr(cfg, "architectures", None) or [])
    spec = registry.model_class(archs[0] if archs else None).spec_from_config(cfg)
    check_spec(spec)
    spec.quant = quant_from_config(cfg, quantization)
    return spec


def load_model(spec: ModelSpec, path: str, dtype, device, *, max_positions: int, load_format: str, seed: int,
               tp: TPGroup = SINGLE, wrap_weights=None, name: str | None = None):
    """The eval-mode model of `spec` (this rank's shard under tensor parallelism):
    random weights of the real shapes (load_format "dummy") or the checkpoint's
    safetensors at `path`, streamed through `wrap_weights` when given (the fault
    injector's hook). ModelLoadError, naming `name` (default: path), when they do not fit."""
    cls = registry.model_class(spec.architecture)
    torch.manual_seed(seed)
    try:
        model = cls(spec, dtype, device, max_positions=max_positions, tp=tp)
        if load_format == "dummy":
            fill_dummy_weights(model, seed)
        else:
            weights = iter_weights(safetensors_files(path), "cpu")
            load_weights(model, wrap_weights(weights) if wrap_weights else weights)
    except ModelLoadError:
        raise
    except (ValueError, RuntimeError, OSError) as exc:
        raise ModelLoadError(f"weights of {name or path!r} could not be loaded: {exc}") from exc
    return model.eval()


def loadable_modules(model) -> dict:
    """The modules that load their own tensors: load(shard, name, tensor), expected(), loaded, finalize()."""
    return {n: m for n, m in model.named_modules() if hasattr(m, "expected") and hasattr(m, "load")}


def default_route(model, key: str) -> tuple[str, object, str]:
    """(loadable module, shard, tensor name) of one of our tensor names, through the
    model's packed_modules_mapping (q_proj -> shard 0 of qkv_proj, ...)."""
    module, _, param = key.rpartition(".")
    parent, _, proj = module.rpartition(".")
    target, shard = model.packed_modules_mapping.get(proj, (proj, 0))
    return (f"{parent}.{target}" if parent else target), shard, param


def load_weights(model, weights) -> None:
    """weights: iterable of (checkpoint name, tensor). Each goes where the model's
    checkpoint_name and packed_modules_mapping put it: into a loadable module (a merged
    shard of a linear, this rank's part) or a parameter of its own (copied). Every
    parameter must be filled and every checkpoint tensor used; otherwise ValueError.
    A model may route names itself: route_weight(key) -> (module, shard, tensor name) or None."""
    modules = loadable_modules(model)
    custom = getattr(model, "route_weight", None)

    def route(key):
        return (custom(key) if custom else None) or default_route(model, key)

    params = {n: p for n, p in model.named_parameters() if n.rpartition(".")[0] not in modules}
    filled = set()
    for ckpt_name, tensor in weights:
        key = model.checkpoint_name(ckpt_name)
        if key is None:
            continue
        if key in params:
            if params[key].shape != tensor.shape:
                raise ValueError(f"{ckpt_name}: checkpoint shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(params[key].shape)}")
            params[key].data.copy_(tensor)
            filled.add(key)
            continue
        target, shard, param = route(key)
        owner = modules.get(target)
        if owner is None:
            raise ValueError(f"checkpoint tensor {ckpt_name} has no place in the model")
        try:
            owner.load(shard, param, tensor)
        except KeyError as exc:
            raise ValueError(f"checkpoint tensor {ckpt_name}: {target} has no tensor {exc}") from None
        except ValueError as exc:
            raise ValueError(f"checkpoint tensor {ckpt_name}: {exc}") from None
    missing = [f"{n} {e}" for n, m in modules.items() for e in sorted(m.expected() - m.loaded)]
    missing += [n for n in params if n not in filled]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    for m in modules.values():
        m.finalize()


@torch.no_grad()
def fill_dummy_weights(model, seed: int = 0) -> None:
    """Random weights of the real shapes, made on the model's device from a seed:
    packed integers random bits, quantization scales small and positive, norms one."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    kept = set(model.state_dict(keep_vars=True))  # not the buffers computed at build (the rope cache)
    buffers = {n for n, _ in model.named_buffers()}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name not in kept:
            continue
        if not t.is_floating_point():
            t.copy_(torch.randint(-(2**31), 2**31 - 1, t.shape, generator=gen, device=t.device, dtype=t.dtype))
        elif t.dtype in llm_kernels.FP8_DTYPES:  # FP8 weights: N(0, 1) codes (their scales are small buffers)
            t.copy_(torch.randn(t.shape, generator=gen, device=t.device).to(t.dtype))
        elif name in buffers:
            t.uniform_(0.001, 0.004, generator=gen)
        elif "norm" in name:
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=gen)
    del t  # no reference past the layers' own: finalize frees each checkpoint copy it repacks at once
    for m in loadable_modules(model).values():
        m.finalize()
