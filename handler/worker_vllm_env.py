"""worker-vllm's environment variables at start, as handler.worker_vllm_names rules them:
`translate` (load_settings calls it) refuses the variables whose meaning this worker cannot
honour (SettingsError naming the variable and what to do: the worker exits 2 as for any bad
setting), reads VLLM_EXTRA_ARGS's flags as their variables, worker-vllm's names as ours
(ALIASES) and its values as ours (DTYPE=half, MAX_MODEL_LEN=auto, ...); `start_notes` are the
lines logged once at start for the variables that do not apply here."""
from __future__ import annotations

import json
from collections.abc import Collection, Mapping

from handler.setting_error import SettingsError
from handler.worker_vllm_args import NAME as EXTRA, parse as parse_extra_args
from handler.worker_vllm_names import ALIASES, EXTRA_ARGS_RULES, NOTED, REFUSED, RULES, Rule

DTYPES = {"half": "float16", "float": "float32"}
# vLLM's names this engine has no method for (ours: awq, gptq and their _marlin names, compressed-tensors, fp8)
VLLM_ONLY_QUANTIZATIONS = frozenset({
    "aqlm", "deepspeedfp", "tpu_int8", "ptpc_fp8", "fbgemm_fp8", "modelopt", "modelopt_fp4", "marlin", "bitblas",
    "gguf", "gptq_marlin_24", "gptq_bitblas", "bitsandbytes", "qqq", "hqq", "experts_int8", "neuron_quant", "ipex",
    "quark", "moe_wna16", "torchao", "auto-round", "rtn", "inc", "mxfp4", "squeezellm", "awq_triton",
})
VLLM_ONLY_BLOCK_SIZES = frozenset({"1", "64", "128"})
NOT_APPLICABLE = {name: rule.text for name, rule in RULES.items() if rule.kind == NOTED}


def variables(env: Mapping[str, str]) -> list[tuple[str, str, str, Rule]]:
    """(where it was set, variable, value, rule) of each worker-vllm variable set in `env`,
    VLLM_EXTRA_ARGS's flags after the variables (they win, as appended last by worker-vllm);
    `where` is the variable's name, or `VLLM_EXTRA_ARGS --flag`."""
    out = [(name, name, value, RULES[name]) for name, value in env.items()
           if name in RULES and name != EXTRA and (value or "").strip()]
    for flag, name, value in parse_extra_args(env.get(EXTRA) or ""):
        out.append((f"{EXTRA} {flag}", name, value, EXTRA_ARGS_RULES.get(name) or RULES[name]))
    return out


def translate(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(the environment as our settings read it, notes on what was changed). Raises
    SettingsError for a variable (or VLLM_EXTRA_ARGS flag) refused here."""
    out, notes, found = dict(env), [], variables(env)
    for where, name, value, rule in found:
        if where != name and rule.kind not in (NOTED, REFUSED):  # a VLLM_EXTRA_ARGS flag: as its variable
            out[rule.text.split("`")[1] if name in EXTRA_ARGS_RULES else name] = value  # --model: MODEL_NAME
    for where, name, value, rule in found:
        _refuse(where, name, value, rule, out)
    for theirs, ours in ALIASES.items():
        if (out.get(theirs) or "").strip() and not (out.get(ours) or "").strip():
            out[ours] = out[theirs]
    dtype = (out.get("DTYPE") or "").strip().lower()
    if dtype in DTYPES:
        out["DTYPE"] = DTYPES[dtype]
    if (out.get("MAX_NUM_BATCHED_TOKENS") or "").strip() == "0":  # worker-vllm: the engine's default
        out["MAX_NUM_BATCHED_TOKENS"] = ""
    for name, ok, why in (
            ("MAX_MODEL_LEN", lambda v: v not in ("auto", "-1"), "the model's context length is used"),
            ("QUANTIZATION", lambda v: v not in VLLM_ONLY_QUANTIZATIONS, "not supported here; the checkpoint's "
             "own quantization (config.json) is used"),
            ("BLOCK_SIZE", lambda v: v not in VLLM_ONLY_BLOCK_SIZES, "this engine's blocks are 8, 16 or 32 "
             "tokens; 16 is used")):
        value = (out.get(name) or "").strip().lower()
        if value and not ok(value):
            notes.append(f"{name}={value}: {why}")
            out[name] = ""
    _speculative(out, notes)
    return out, notes


def _refuse(where: str, name: str, value: str, rule: Rule, env: Mapping[str, str]) -> None:
    """SettingsError for a value this worker cannot honour: the rule's kind REFUSED (any value,
    or those its `refused_if` picks), or another kind's `refused_if`."""
    refused = rule.refused_if(value, env) if rule.refused_if is not None else rule.kind == REFUSED
    if not refused:
        return
    what = rule.refusal or rule.text
    if where == name:
        raise SettingsError(name, value, what)
    what = what.replace("unset it", f"remove it from {EXTRA}")
    raise SettingsError(EXTRA, env.get(EXTRA, ""), f"{where.split(' ', 1)[1]} (as {name}={value}): {what}")


def _speculative(out: dict[str, str], notes: list[str]) -> None:
    """SPECULATIVE_CONFIG as vLLM reads it: `"model": "[ngram]"` (its older spelling) is method ngram,
    another `model` without a method a draft model (method draft_model); a method this engine lacks
    (EAGLE, Medusa, MTP, ...) is dropped with a note."""
    raw = (out.get("SPECULATIVE_CONFIG") or "").strip()
    try:
        config = json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return  # the setting's own check names the variable
    if not isinstance(config, dict):
        return
    model = config.get("model")
    method = config.get("method") or ("ngram" if model in ("[ngram]", "ngram") else "draft_model" if model else None)
    if method == "ngram":
        config = {k: v for k, v in config.items() if k != "model"} | {"method": "ngram"}
        out["SPECULATIVE_CONFIG"] = json.dumps(config)
    elif method == "draft_model":
        out["SPECULATIVE_CONFIG"] = json.dumps(config | {"method": "draft_model"})
    elif method is not None:
        notes.append(f"SPECULATIVE_CONFIG: method {method!r} is not implemented here (only ngram and "
                     "draft_model); speculation stays as without it")
        out["SPECULATIVE_CONFIG"] = ""


def start_notes(env: Mapping[str, str], ours: Collection[str]) -> list[str]:
    """One line for each worker-vllm variable set in `env` (or flag of VLLM_EXTRA_ARGS) that this
    worker does not apply (`ours`: our settings' names, which win), and for each value changed."""
    from handler.tools import tool_calls

    notes = translate(env)[1]
    for where, name, value, rule in variables(env):
        if name == "TOOL_CALL_PARSER" and value.strip().lower() not in tool_calls.PARSERS:  # auto tool choice off
            notes.append(f"{where}={value} is not implemented here (only {', '.join(tool_calls.PARSERS)}); "
                         "ENABLE_AUTO_TOOL_CHOICE is false, so no tool calls are parsed")
        if rule.kind == NOTED and (where != name or name not in ours):
            notes.append(f"{where} (a worker-vllm setting) is not applicable to this worker: {rule.text}; ignored")
    return notes
