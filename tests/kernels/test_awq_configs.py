"""llm_kernels.awq_configs: how each AWQ GEMM asks the tuner, and the first candidates
(the interpreter's and the one used in a capture before a shape is tuned)."""
import torch

from llm_kernels import awq_configs
from llm_kernels.awq import pack_awq_int4
from llm_kernels.awq_configs import CKPT, DENSE, KPACK, ckpt_configs, ckpt_gemm, kpack_configs, kpack_gemm
from llm_kernels.awq_kpack import kpack_from_awq


def test_both_gemms_check_their_candidates_and_kpack_times_with_the_l2_cold(rng, monkeypatch):
    asked = []

    def fake_autotune(name, key, configs, launch, **kw):
        asked.append((name, key, kw))
        return (configs() if callable(configs) else configs)[0]

    monkeypatch.setattr(awq_configs, "autotune", fake_autotune)
    K, N, G = 256, 64, 64
    qw = pack_awq_int4(torch.randint(0, 16, (K, N), generator=rng))
    qz = pack_awq_int4(torch.randint(0, 16, (K // G, N), generator=rng))
    s = torch.rand(K // G, N, generator=rng) * 0.01
    x = torch.randn(5, K, generator=rng)
    ckpt_gemm(x, qw, qz, s, G)
    kpack_gemm(x, *kpack_from_awq(qw, qz, G), s, G)
    assert asked[0] == (CKPT, (8, N, K, G, torch.float32), {"checked": (torch.float32, G)})
    assert asked[1] == (KPACK, (8, N, K, G, torch.float32),
                        {"checked": (torch.float32, G), "cold_l2_device": x.device})


def test_first_checkpoint_candidate_is_plain_triton():
    """No inline PTX in the first candidate (DEQ 2): it is also the yardstick the others
    are checked against."""
    cuda = torch.device("cuda")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for M in (1, 16, 32, 64, 256, 1024):
            first = ckpt_configs(M, dtype, cuda)[0]
            assert first is DENSE or (first["kind"] == "fused" and first["deq"] < 2), (M, dtype, first)


def test_kpack_candidates_are_distinct(monkeypatch):
    monkeypatch.setattr(awq_configs, "sm_count", lambda device: 132)
    cuda = torch.device("cuda")
    for M in (1, 16, 64, 256, 512, 1024):
        cands = kpack_configs(M, torch.bfloat16, cuda)
        assert len({tuple(sorted(c.items())) for c in cands}) == len(cands), M
