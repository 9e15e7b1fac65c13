"""How a W4A16 step asks the tuner (llm_kernels.w4a16.weight): one tuning name a layout, the
shape key, the checked flag, the dense path first wherever it competes; and the candidate lists
of llm_kernels.w4a16.configs (distinct configs; the checkpoint layout's yardstick plain Triton)."""
import pytest
import torch

from llm_kernels.w4a16 import pack_awq_int4, prepare, weight
from llm_kernels.w4a16.configs import DENSE, ckpt_configs, kpack_configs
from llm_kernels.w4a16.select import CHECKPOINT, KPACK


@pytest.mark.parametrize("layout,M,first_dense", [(KPACK, 5, False), (KPACK, 40, True), (CHECKPOINT, 5, False),
                                                  (CHECKPOINT, 100, True)])
def test_a_step_asks_the_tuner_once_per_layout_and_shape(rng, monkeypatch, layout, M, first_dense):
    asked = []

    def fake_autotune(name, key, configs, launch, **kw):
        cands = configs() if callable(configs) else configs
        asked.append((name, key, kw, cands))
        return cands[0]

    monkeypatch.setattr(weight, "autotune", fake_autotune)
    K, N, G = 256, 64, 64
    qw = pack_awq_int4(torch.randint(0, 16, (K, N), generator=rng))
    qz = pack_awq_int4(torch.randint(0, 16, (K // G, N), generator=rng))
    s = torch.rand(K // G, N, generator=rng) * 0.01
    weight.linear(torch.randn(M, K, generator=rng).to(torch.float16), prepare(qw, qz, s.half(), G, layout))
    (name, key, kw, cands), = asked
    assert name == weight.TUNED[layout] and key == (1 << (M - 1).bit_length(), N, K, G, torch.float16)
    assert kw == {"checked": (torch.float16, G), "cold_l2_device": None}  # cold L2 on CUDA only
    assert (cands[0] is DENSE) == first_dense and cands.count(DENSE) == int(first_dense)
    assert len(cands) > 1 or (layout, M) == (CHECKPOINT, 100)  # above 16 tokens the checkpoint layout has only dense


def test_first_checkpoint_candidate_is_plain_triton():
    """No inline PTX (DEQ 2) in the first checkpoint-layout config: at up to 16 tokens, where
    the dense path does not compete, it is the yardstick the others are checked against."""
    cuda = torch.device("cuda")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for M in (1, 4, 16):
            first = ckpt_configs(M, dtype, cuda)[0]
            assert first["kind"] == "fused" and first["deq"] < 2, (M, dtype, first)


def test_candidates_are_distinct(monkeypatch):
    monkeypatch.setattr("llm_kernels.w4a16.configs.sm_count", lambda device: 132)
    cuda = torch.device("cuda")
    for dtype in (torch.bfloat16, torch.float32):
        for M in (1, 16, 32, 64, 128, 256, 512):
            lists = [kpack_configs(M, dtype, cuda)] + ([ckpt_configs(M, dtype, cuda)] if M <= 16 else [])
            for cands in lists:
                assert cands and len({tuple(sorted(c.items())) for c in cands}) == len(cands), (M, dtype)
