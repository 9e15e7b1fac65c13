"""Rotary position embeddings: the cos/sin cache that llm_kernels.rotary_embedding reads,
for rope types default, linear, llama3, yarn and longrope, over all of head_dim or
only its first rotary_dim dims (transformers' partial_rotary_factor).

Numerics follow transformers 5 (modeling_rope_utils): the same float32 operations
in the same order, so the cache rows equal its rotary embedding's cos/sin.

Row convention: row p holds position p's cos (first half) and sin (second half),
both multiplied by the rope type's attention factor (yarn and longrope; 1 else).
A longrope cache is two-sided: 2 * max_positions rows, row p the short-factor
angles of position p and row max_positions + p the long-factor ones. transformers
takes the long factor for every token of a forward whose sequence length
(max position + 1) exceeds original_max_position_embeddings (rope_long_after), the
short one otherwise; rope_rows turns positions and that choice into cache rows.

"dynamic" (dynamic NTK) is not supported: transformers recomputes the base from
the current sequence length of each forward, so a prefill of L > max_position
_embeddings tokens rotates all L of them with base(L), while the decode step at
position p uses base(p + 1). Position p's angles thus depend on the prompt's
length, not on p alone, which no fixed per-position cache (one row per position,
or any fixed number of rows per position) reproduces; and the module keeps that
base across generate calls (it only resets below max_position_embeddings), so a
later prompt's result depends on earlier ones. Matching it would need per-forward
cos/sin, so it stays out of ROPE_TYPES and spec.rope_from_config refuses it.
"""
from __future__ import annotations

import math

import torch

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def _rope_type(scaling: dict | None) -> str:
    return (scaling or {}).get("rope_type", "default")


def _base_powers(dim: int, theta: float) -> torch.Tensor:
    """theta ** (2i / dim) for i < ceil(dim / 2), float32."""
    return theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)


def _original_length(scaling: dict, max_position_embeddings: int | None) -> int:
    """original_max_position_embeddings, defaulting (as transformers does) to the config's max."""
    orig = scaling.get("original_max_position_embeddings") or max_position_embeddings
    if orig is None:
        raise ValueError(f"rope {_rope_type(scaling)!r} needs original_max_position_embeddings or max_position_embeddings")
    return int(orig)


def _factor(scaling: dict, max_position_embeddings: int | None) -> float:
    """yarn/longrope's factor; when absent, max_position_embeddings / original (transformers)."""
    factor = scaling.get("factor")
    if factor is not None:
        return float(factor)
    if max_position_embeddings is None:
        raise ValueError(f"rope {_rope_type(scaling)!r} has no factor: it needs max_position_embeddings")
    return max_position_embeddings / _original_length(scaling, max_position_embeddings)


def _llama3_inv_freq(inv: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_ramp_bounds(dim: int, theta: float, scaling: dict, orig: int) -> tuple[float, float]:
    """The dims between which yarn blends interpolation into extrapolation."""
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low = correction_dim(scaling.get("beta_fast") or 32)
    high = correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    return low, high


def _yarn_inv_freq(dim: int, theta: float, scaling: dict, max_position_embeddings: int | None) -> torch.Tensor:
    factor = _factor(scaling, max_position_embeddings)
    orig = _original_length(scaling, max_position_embeddings)
    low, high = _yarn_ramp_bounds(dim, theta, scaling, orig)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # weight of the unscaled (extrapolated) frequency
    powers = _base_powers(dim, theta)
    extrapolated = 1.0 / powers
    interpolated = 1.0 / (factor * powers)
    return interpolated * (1 - keep) + extrapolated * keep


def _longrope_inv_freq(dim: int, theta: float, scaling: dict, long: bool) -> torch.Tensor:
    ext = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
    if ext.numel() != (dim + 1) // 2:
        raise ValueError(f"longrope factors have {ext.numel()} entries, the rotary dims need {(dim + 1) // 2}")
    return 1.0 / (ext * _base_powers(dim, theta))


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None, *,
                  max_position_embeddings: int | None = None, long: bool = False) -> torch.Tensor:
    """Inverse frequencies (float32, ceil(head_dim / 2) of them) of a rope type in
    ROPE_TYPES over head_dim rotated dims (pass the rotary dim for partial rotary).
    max_position_embeddings: the config's (yarn/longrope may derive factor and
    original length from it). long: longrope's long factor instead of the short one."""
    kind = _rope_type(scaling)
    if kind == "default":
        return 1.0 / _base_powers(head_dim, theta)
    if kind == "linear":
        return 1.0 / _base_powers(head_dim, theta) / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_inv_freq(1.0 / _base_powers(head_dim, theta), scaling)
    if kind == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling, max_position_embeddings)
    if kind == "longrope":
        return _longrope_inv_freq(head_dim, theta, scaling, long)
    raise ValueError(f"rope type {kind!r} is not supported ({sorted(ROPE_TYPES)})")


def _mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(scaling: dict | None, *, max_position_embeddings: int | None = None) -> float:
    """What transformers multiplies cos and sin by (its attention_scaling): the
    given attention_factor, else yarn's mscale ratio or longrope's sqrt(1 + log
    factor / log original); 1.0 for the other rope types."""
    kind = _rope_type(scaling)
    if kind not in ("yarn", "longrope"):
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = _factor(scaling, max_position_embeddings)
    if kind == "yarn":
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            return float(_mscale(factor, mscale) / _mscale(factor, mscale_all_dim))
        return _mscale(factor)
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(_original_length(scaling, max_position_embeddings)))


def rope_is_two_sided(scaling: dict | None) -> bool:
    """True for longrope, whose cache holds short-factor rows then long-factor rows."""
    return _rope_type(scaling) == "longrope"


def rope_long_after(scaling: dict | None, *, max_position_embeddings: int | None = None) -> int | None:
    """For a two-sided (longrope) cache, the sequence length past which transformers
    uses the long rows (original_max_position_embeddings); None otherwise."""
    if not rope_is_two_sided(scaling):
        return None
    return _original_length(scaling, max_position_embeddings)


def rope_rows(positions: torch.Tensor, long_mask: torch.Tensor | None, scaling: dict | None,
              max_positions: int) -> torch.Tensor:
    """Cache rows of tokens at positions: the positions themselves, except for a
    two-sided (longrope) cache, where a token with long_mask True reads row
    max_positions + position. long_mask (bool, broadcastable to positions; None:
    all short) should be True for every token of a sequence whose length, counted
    as transformers does (its longest forward so far: prompt length in prefill,
    position + 1 in decode), exceeds rope_long_after(scaling)."""
    if not rope_is_two_sided(scaling) or long_mask is None:
        return positions
    return positions + long_mask.to(positions.dtype) * max_positions


def _cos_sin(inv: torch.Tensor, max_positions: int, attention_factor: float) -> torch.Tensor:
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.int64).float(), inv)
    cos, sin = freqs.cos(), freqs.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return torch.cat((cos, sin), dim=-1)


def rope_cache(head_dim: int, max_positions: int, theta: float, scaling: dict | None, device, *,
               rotary_dim: int | None = None, max_position_embeddings: int | None = None) -> torch.Tensor:
    """float32 [rows, 2 * ceil(rotary_dim / 2)]: per row, cos of the position's angles
    then their sin, times the attention factor. rows is max_positions, or twice that
    for a two-sided (longrope) cache: short-factor rows then long-factor rows (see
    rope_rows). rotary_dim: the dims rotated (default head_dim; transformers'
    int(head_dim * partial_rotary_factor)); the kernel leaves the rest untouched.
    max_position_embeddings: the config's, which yarn/longrope may need."""
    dim = head_dim if rotary_dim is None else int(rotary_dim)
    if not 0 < dim <= head_dim:
        raise ValueError(f"rotary_dim {dim} must be in 1..head_dim ({head_dim})")
    factor = rope_attention_factor(scaling, max_position_embeddings=max_position_embeddings)
    sides = (False, True) if rope_is_two_sided(scaling) else (False,)
    parts = [_cos_sin(rope_inv_freq(dim, theta, scaling, max_position_embeddings=max_position_embeddings, long=long),
                      max_positions, factor) for long in sides]
    return torch.cat(parts, dim=0).to(device)
