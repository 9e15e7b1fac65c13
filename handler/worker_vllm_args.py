"""worker-vllm's VLLM_EXTRA_ARGS (raw `vllm serve` flags it appends to the command line) as the
variables the flags are named after: `--max-num-seqs 64` is MAX_NUM_SEQS=64, `--enforce-eager`
alone ENFORCE_EAGER=true, `--no-enable-prefix-caching` ENABLE_PREFIX_CACHING=false, `--lora-modules
a=/x b=/y` LORA_MODULES="a=/x b=/y", so each one is honoured, mapped, noted or refused as that
variable is (handler.worker_vllm_names)."""
from __future__ import annotations

import shlex

from handler.setting_error import SettingsError
from handler.worker_vllm_names import EXTRA_ARGS_RULES, RULES, SHORT_FLAGS

NAME = "VLLM_EXTRA_ARGS"
# flags that take several words (vLLM's nargs="+"): `--lora-modules a=/x b=/y` is LORA_MODULES="a=/x b=/y"
MULTI_WORD = {"LORA_MODULES"}


def flag_name(flag: str) -> str:
    """A flag's variable name, as worker-vllm derives flags from names: `--max-num-seqs` -> MAX_NUM_SEQS."""
    return SHORT_FLAGS.get(flag) or flag.lstrip("-").replace("-", "_").upper()


def parse(raw: str) -> list[tuple[str, str, str]]:
    """(flag as written, variable name, value) for each flag of `raw`, in order. A flag is
    followed by its value unless the next word is a flag (then it is a boolean: true, or false
    for `--no-X`); `--flag=value` is one flag. Raises SettingsError naming VLLM_EXTRA_ARGS for
    unbalanced quotes, a word that belongs to no flag, or a flag this worker does not know."""
    try:
        words = shlex.split(raw)
    except ValueError as exc:
        raise SettingsError(NAME, raw, f"cannot be split as shell words ({exc})") from None
    out, i = [], 0
    while i < len(words):
        flag = words[i]
        if not flag.startswith("-") or flag in ("-", "--"):
            raise SettingsError(NAME, raw, f"{flag!r} is not a flag (expected `--flag value` or `--flag`)")
        value = None
        if "=" in flag and flag.startswith("--"):
            flag, value = flag.split("=", 1)
        elif i + 1 < len(words) and not _is_flag(words[i + 1]):
            value = words[i + 1]
            i += 1
            while flag_name(flag) in MULTI_WORD and i + 1 < len(words) and not _is_flag(words[i + 1]):
                value += " " + words[i + 1]
                i += 1
        i += 1
        name = flag_name(flag)
        if value is None and name.startswith("NO_") and _known(name[3:]):
            name, value = name[3:], "false"
        if not _known(name) or (flag.startswith("-") and not flag.startswith("--") and flag not in SHORT_FLAGS):
            raise SettingsError(NAME, raw, f"{flag}: not a vllm serve flag this worker knows (docs/deploy.md's "
                                "worker-vllm table): remove it")
        out.append((flag, name, "true" if value is None else value))
    return out


def _known(name: str) -> bool:
    return name in RULES or name in EXTRA_ARGS_RULES


def _is_flag(word: str) -> bool:
    """`--x` or a short flag; `-1` (a value) is not."""
    return word.startswith("--") or word in SHORT_FLAGS
