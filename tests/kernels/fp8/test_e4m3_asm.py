"""The W8A16 kernel's PTX conversion (llm_kernels.fp8.w8a16.e4m3_asm), run by a small emulator
of the instructions it uses, turns every finite e4m3 byte into its exact value (bf16) or exactly
2^-8 times it (fp16), 2 and 4 bytes a call: the GPU runs this code where no test here can."""
import re
import struct

import pytest
import torch

from llm_kernels.fp8 import FP8
from llm_kernels.fp8.w8a16 import BITS_FACTOR, e4m3_asm


def _prmt(a: int, b: int, sel: int) -> int:
    src = a | (b << 32)
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = (src >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    return sum((((lut >> ((((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1))) & 1) << i)
               for i in range(32))


def _bf16(h: int) -> float:
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def _to_bf16(v: float) -> int:
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    assert bits & 0xFFFF == 0, f"{v} is not a bf16: the emulated FMA would round"
    return bits >> 16


def _fma_bf16x2(a: int, b: int, c: int) -> int:
    halves = [_to_bf16(_bf16((a >> s) & 0xFFFF) * _bf16((b >> s) & 0xFFFF) + _bf16((c >> s) & 0xFFFF))
              for s in (0, 16)]
    return halves[0] | (halves[1] << 16)


def run_ptx(code: str, operands: list[int], outputs: int) -> list[int]:
    """Run the asm block on operand registers ($outputs.. hold the inputs); returns $0..$outputs-1."""
    regs = {f"${i + outputs}": v for i, v in enumerate(operands)}

    def val(x):
        return regs[x] if x in regs else int(x, 0)

    for ins in code.strip("{} ").split(";"):
        ins = ins.strip()
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        d, *src = [a.strip() for a in args.split(",")]
        v = [val(s) for s in src]
        if op in ("mov.b32", "cvt.u32.u16"):
            r = v[0] & (0xFFFF if op == "cvt.u32.u16" else 0xFFFFFFFF)
        elif op == "prmt.b32":
            r = _prmt(*v)
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "shr.b32":
            r = v[0] >> v[1]
        elif op == "lop3.b32":
            r = _lop3(*v)
        elif op == "fma.rn.bf16x2":
            r = _fma_bf16x2(*v)
        else:
            raise AssertionError(f"the emulator does not know {op}")
        regs[d] = r & 0xFFFFFFFF
    return [regs[f"${i}"] for i in range(outputs)]


FINITE = [b for b in range(256) if b & 0x7F != 0x7F]


def _value(byte: int) -> float:
    return torch.tensor([byte], dtype=torch.uint8).view(FP8).float().item()


@pytest.mark.parametrize("pack", [2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ptx_conversion_is_exact_for_every_byte(dtype, pack):
    code = e4m3_asm(dtype, pack)
    assert re.search(r"\bcvt\.(rn|rz)", code) is None  # no conversion instruction
    factor = 1.0 if dtype == torch.bfloat16 else 1.0 / BITS_FACTOR
    decode = _bf16 if dtype == torch.bfloat16 else (lambda h: struct.unpack("<e", struct.pack("<H", h))[0])
    for i in range(0, len(FINITE), pack):
        group = (FINITE[i:] + FINITE)[:pack]
        word = sum(b << (8 * j) for j, b in enumerate(group))
        regs = run_ptx(code, [word], pack // 2)
        got = [decode((r >> s) & 0xFFFF) for r in regs for s in (0, 16)]
        assert got == [_value(b) * factor for b in group], [hex(b) for b in group]
