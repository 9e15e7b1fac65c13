"""The W8A16 kernel compiles for the GPUs it is meant for, on this machine without one
(llm_kernels.fp8.aot: Triton's compiler and its ptxas): the hardware e4m3 conversion and the
PTX bit moves to wgmma on Hopper (sm_90), the bit moves to mma.sync on Ampere (sm_80), where
Triton refuses the hardware conversion's type; a few configs (each compile takes about a
second); benchmarks-free checks of what the GPU run then measures. Each check runs in a fresh
process (tests/kernels/fresh_process.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llm_kernels.fp8.aot import compile_w8a16
from llm_kernels.fp8.configs import w8a8_configs, w8a16_config
from tests.kernels.fresh_process import run_fresh
from tests.kernels.kernel_checks import partials_in_vectors

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("arch,cvt,mma", [(90, "native", "wgmma"), (90, "asm", "wgmma"), (80, "native", "mma.sync"),
                                          (80, "asm", "mma.sync")])
def test_the_kernel_compiles_for_hopper_and_ampere(arch, cvt, mma):
    run_fresh(__name__, "check_compile", arch, cvt, mma)


def check_compile(arch: int, cvt: str, mma: str) -> None:
    cfg = w8a16_config(16, 64, 128, cvt=cvt)
    k = compile_w8a16(arch, torch.bfloat16, cfg, block=(128, 128) if cvt == "asm" else None)
    ptx = k.asm["ptx"]
    assert mma in ptx and "cp.async" in ptx  # tensor cores, and the weight tiles pipelined
    assert ("cvt.rn.f16x2.e4m3x2" in ptx) == (arch >= 89 and cvt == "native")
    assert k.metadata.shared <= 227 * 1024
    assert partials_in_vectors(ptx)  # split in 2: the partials read back 16 bytes at a time


@pytest.mark.parametrize("arch,mma", [(90, "wgmma.mma_async.sync.aligned.m64n"), (89, "mma.sync.aligned.m16n8k32")])
def test_the_w8a8_kernel_compiles_to_fp8_tensor_cores(arch, mma):
    run_fresh(__name__, "check_w8a8_compile", arch, mma)


def check_w8a8_compile(arch: int, mma: str) -> None:
    """Every GPU candidate at 64 and 256 tokens, per-channel and 128 x 128 block scales: e4m3 x
    e4m3 MMAs, pipelined loads, no conversion of the operands, within Hopper's shared memory."""
    for M in (64, 256):
        for block in (None, (128, 128)):
            for cfg in w8a8_configs(M, torch.device("cuda"), block[1] if block else 0):
                ptx = (k := compile_w8a16(arch, torch.bfloat16, cfg, block=block)).asm["ptx"]
                assert f"{mma}" in ptx and ".e4m3.e4m3" in ptx and "cp.async" in ptx, (cfg, block)
                assert "cvt.rn.f16x2.e4m3x2" not in ptx and k.metadata.shared <= 227 * 1024, (cfg, block)
                assert partials_in_vectors(ptx), (cfg, block)


def test_the_hardware_conversion_is_refused_below_sm89():
    """In a fresh process: after an interpreted launch in this one, Triton reports the same
    refusal as another error."""
    code = ("import torch; from llm_kernels.fp8 import w8a16; from llm_kernels.fp8.aot import compile_w8a16; "
            "from llm_kernels.fp8.configs import w8a16_config; "
            "compile_w8a16(86, torch.float16, w8a16_config(16, 64, 128), forced_cvt=w8a16.NATIVE)")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "fp8e4nv not supported in this architecture" in run.stderr, run.stderr[-2000:]
