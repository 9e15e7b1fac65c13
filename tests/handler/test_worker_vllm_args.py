"""VLLM_EXTRA_ARGS split into (flag, variable, value): values, bare and `--no-` booleans,
`--flag=value`, quoted JSON, vLLM's short flags; a stray word, a flag this worker does not know
and unbalanced quotes are refused naming VLLM_EXTRA_ARGS."""
import pytest

from handler.settings import SettingsError
from handler.worker_vllm_args import flag_name, parse


def test_flags_become_their_variables():
    raw = ("--max-num-seqs 64 --enforce-eager --no-enable-prefix-caching --max-model-len=4096 "
           "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}' -tp 2 --seed -1 "
           "--trust-remote-code")
    assert parse(raw) == [
        ("--max-num-seqs", "MAX_NUM_SEQS", "64"), ("--enforce-eager", "ENFORCE_EAGER", "true"),
        ("--no-enable-prefix-caching", "ENABLE_PREFIX_CACHING", "false"), ("--max-model-len", "MAX_MODEL_LEN", "4096"),
        ("--speculative-config", "SPECULATIVE_CONFIG", '{"method": "ngram", "num_speculative_tokens": 3}'),
        ("-tp", "TENSOR_PARALLEL_SIZE", "2"), ("--seed", "SEED", "-1"),
        ("--trust-remote-code", "TRUST_REMOTE_CODE", "true")]
    assert parse("") == [] and parse("  ") == []
    assert flag_name("--kv-cache-dtype") == "KV_CACHE_DTYPE" and flag_name("-q") == "QUANTIZATION"


@pytest.mark.parametrize("raw, problem", [
    ("--max-num-seqs 8 16", "'16' is not a flag"),
    ("max-num-seqs 8", "'max-num-seqs' is not a flag"),
    ("--no-such-flag 1", "--no-such-flag: not a vllm serve flag this worker knows"),
    ("--help", "--help: not a vllm serve flag"),
    ("-x 1", "-x: not a vllm serve flag"),
    ("--chat-template '{{ x }}", "cannot be split as shell words"),
])
def test_what_cannot_be_read_is_refused_naming_the_variable(raw, problem):
    with pytest.raises(SettingsError, match="^VLLM_EXTRA_ARGS=") as info:
        parse(raw)
    assert problem in str(info.value)
