"""The CUDA C++ kernels compile as the engine compiles them on a GPU (NVRTC, then ptxas for the
chip; llm_kernels.cuda_compile), here without one: every awq_tile config of every tuning
bucket without spills for Hopper and Ampere, and awq_mma's configs at the decode sizes. A
typo or a register blow-up in a kernel that only runs on the device fails here first."""
import ctypes
import os
import tempfile

import pytest

from llm_kernels import awq_mma, awq_tile
from llm_kernels.cuda_compile import compile_cubin, nvrtc_path, ptxas_path

LIMITS = {90: 227 * 1024, 80: 163 * 1024}  # the shared memory a block may opt in to: H100/H200, A100


@pytest.fixture(scope="module")
def nvrtc():
    path, ptxas = nvrtc_path(), ptxas_path()
    assert path and ptxas, "the test extras install nvidia-cuda-nvrtc-cu12; triton bundles ptxas"
    return ctypes.CDLL(path)


def _compile(lib, name: str, src: str, arch: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return compile_cubin(lib, src, name, arch, os.path.join(tmp, "k.cubin"))


@pytest.mark.parametrize("arch", [90, 80])
def test_every_tile_config_compiles_without_spills(nvrtc, arch):
    seen = set()
    for bucket in (32, 64, 128, 256):
        for N in (4608, 896):  # Qwen2.5-7B's qkv (every config), Qwen2.5-0.5B's hidden (128 columns a block)
            for cfg in awq_tile.tile_configs(bucket, N, 3584, 132, LIMITS[arch]):
                key = tuple(cfg[k] for k in ("mt", "nwt", "wn", "u", "st", "mb"))
                if key in seen:
                    continue
                seen.add(key)
                res = _compile(nvrtc, *awq_tile.kernel_source(*key), arch)
                assert "error" not in res, (cfg, res)
                assert res["spill_st"] == 0 and res["spill_ld"] == 0, (cfg, res)
                assert cfg["mb"] * cfg["wn"] * 32 * res["regs"] <= 65536, (cfg, res)  # MB blocks an SM
    assert len(seen) >= 8


def test_a_broken_source_is_reported(nvrtc):
    name, src = awq_tile.kernel_source(4, 2, 4, 1, 4, 2)
    with pytest.raises(RuntimeError, match="NVRTC"):
        _compile(nvrtc, name, src.replace("lds4(xw[m]", "lds4(xw_typo[m]"), 90)


def test_the_mma_kernels_configs_compile(nvrtc):
    """awq_mma at 8 and 32 tokens (every config that launches there), for Hopper."""
    for M in (8, 32):
        mt = -(-M // 8)
        for cfg in awq_mma.mma_configs(M, 4608):
            name, src = awq_mma.kernel_source(cfg["nw"], mt, cfg["u"], cfg.get("ntb", 1), cfg.get("sc", 0),
                                              cfg.get("mb", 1))
            res = _compile(nvrtc, name, src, 90)
            assert "error" not in res, (M, cfg, res)
