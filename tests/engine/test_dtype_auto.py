"""dtype "auto": bfloat16 on CUDA and on CPUs whose matmuls run bfloat16 natively
(AVX512-BF16 or AMX-BF16, read from /proc/cpuinfo's flags), float32 on other CPUs; an
explicit dtype is kept as asked."""
import torch

from engine import llm_engine
from engine.llm_engine import cpu_has_native_bf16, resolve_dtype

FLAGS = "fpu vme de pse tsc msr avx2 avx512f avx512bw"


def cpuinfo(tmp_path, name, extra):
    path = tmp_path / name
    path.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {FLAGS} {extra}\n\nprocessor\t: 1\n")
    return str(path)


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    assert cpu_has_native_bf16(cpuinfo(tmp_path, "zen4", "avx512_bf16"))
    assert cpu_has_native_bf16(cpuinfo(tmp_path, "sapphire", "amx_tile amx_bf16"))
    assert not cpu_has_native_bf16(cpuinfo(tmp_path, "old", "avx512_vnni"))
    assert not cpu_has_native_bf16(str(tmp_path / "missing"))  # not Linux: the safe float32


def test_auto_follows_the_device_and_the_cpu(monkeypatch):
    monkeypatch.setattr(llm_engine, "cpu_has_native_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    monkeypatch.setattr(llm_engine, "cpu_has_native_bf16", lambda: False)
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda") == resolve_dtype("auto", "cuda:1") == torch.bfloat16
    assert resolve_dtype("float32", "cuda") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
