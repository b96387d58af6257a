"""Serving dtypes: quantize/dequantize of blocks, and FBGEMM's inference kernel against a torch reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from embshard.runtime.quantized import QuantKernel
from embshard.runtime.routing import KernelSpec, Slot
from embshard.serving.quantize import quantize, rowwise_int8


def _assert_within_int8_error(block, x):
    step = (x.max(1).values - x.min(1).values) / 255
    err = (block.dequantize() - x).abs().max(1).values
    assert bool((err <= step / 2 + 1e-3 * x.abs().max(1).values).all()), (err / step).max()


def _hard_rows(cols: int) -> torch.Tensor:
    """Rows FBGEMM's formula has corner cases for: ranges from 1e-8 to 1e4 (the fp16 bias holds them),
    constant rows, ties, fp16 values."""
    n = 400
    base = torch.randn(n, cols)
    constant = base[:, :1].expand(n, cols).clone()
    constant[::3, 0] += 1e-7
    return torch.cat([base * torch.logspace(-8, 4, n)[:, None], constant, base * 1e-6 + torch.randn(n, 1),
                      torch.randint(-300, 300, (n, cols)) / 4.0, base.half().float()])


@pytest.mark.parametrize("cols", [2, 4, 6, 12, 130])
def test_torch_int8_is_fbgemms_op_bit_for_bit(cols):
    torch.manual_seed(cols)
    x = _hard_rows(cols)
    fused = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(x, 8)
    codes, scale_bias = rowwise_int8(x)
    assert torch.equal(codes, fused[:, :-4])
    assert torch.equal(scale_bias.view(torch.int16), fused[:, -4:].contiguous().view(torch.int16))


@pytest.mark.parametrize("cols", [1, 3, 5, 7])
def test_odd_widths_quantize_as_fbgemm_would(cols):
    """FBGEMM's op refuses these widths; a copy of the last column changes no row's min or max, so
    FBGEMM's codes of the widened block are the odd block's codes."""
    torch.manual_seed(cols)
    x = _hard_rows(cols)
    block = quantize(x, "int8")
    assert tuple(block.weight.shape) == x.shape and block.nbytes == x.shape[0] * (cols + 4)
    fused = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(torch.cat([x, x[:, -1:]], 1), 8)
    assert torch.equal(block.weight, fused[:, :cols])
    assert torch.equal(block.scale_bias.view(torch.int16), fused[:, -4:].contiguous().view(torch.int16))
    rows = torch.randn(64, cols) * torch.linspace(0.01, 3, 64)[:, None]  # ranges fp16 scales resolve
    _assert_within_int8_error(quantize(rows, "int8"), rows)
    assert quantize(torch.zeros(0, cols), "int8").dequantize().shape == (0, cols)


def test_quantize_round_trips_within_each_dtype_error():
    torch.manual_seed(0)
    x = torch.randn(64, 12) * torch.linspace(0.01, 3, 64)[:, None]  # rows of very different ranges
    fp32, fp16, int8 = (quantize(x, d) for d in ("fp32", "fp16", "int8"))
    assert torch.equal(fp32.dequantize(), x) and fp32.scale_bias is None and fp32.nbytes == 64 * 12 * 4
    assert torch.equal(fp16.dequantize(), x.half().float()) and fp16.nbytes == 64 * 12 * 2
    assert int8.weight.dtype == torch.uint8 and int8.scale_bias.dtype == torch.float16
    assert tuple(int8.scale_bias.shape) == (64, 2) and int8.nbytes == 64 * (12 + 4)
    _assert_within_int8_error(int8, x)
    empty = quantize(torch.zeros(0, 8), "int8")
    assert empty.dequantize().shape == (0, 8)
    with pytest.raises(ValueError, match=r"dtype must be one of \['fp16', 'fp32', 'int8'\]"):
        quantize(x, "int4")


def _kernel_spec(widths: list[int], rows: list[int]) -> KernelSpec:
    slots = tuple(Slot(i, f"t{i}", 0, 0, 0, n, 0, d) for i, (n, d) in enumerate(zip(rows, widths)))
    return KernelSpec("quant", "", "x", slots, slots, tuple(range(len(slots))), 0)


@pytest.mark.parametrize("widths", [[8, 12, 4], [3, 5, 6]])  # FBGEMM's pooled kernel mixes widths, odd ones too
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "int8"])
def test_pooled_kernel_sums_the_dequantized_rows(dtype, widths):
    torch.manual_seed(1)
    rows = [50, 30, 7]
    tables = [torch.randn(n, d) for n, d in zip(rows, widths)]
    kernel = QuantKernel(_kernel_spec(widths, rows), pooled=True, dtype=dtype, device=torch.device("cpu"))
    blocks = [quantize(t, dtype) for t in tables]
    for i, b in enumerate(blocks):
        kernel.load_block(i, b.weight, b.scale_bias)
    B = 5
    lengths = torch.randint(0, 4, (len(tables) * B,))
    lengths[3] = 0  # an empty bag
    ids = torch.cat([torch.randint(0, rows[i // B], (int(n),)) for i, n in enumerate(lengths)])
    weights = torch.rand(ids.numel())
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    for psw in (None, weights):
        got = kernel(ids, offsets, psw)
        want = []
        for t, b in enumerate(blocks):
            lo, hi = int(offsets[t * B]), int(offsets[(t + 1) * B])
            bag_offsets = offsets[t * B:(t + 1) * B + 1] - lo
            want.append(F.embedding_bag(ids[lo:hi], b.dequantize(), bag_offsets, mode="sum", include_last_offset=True,
                                        per_sample_weights=None if psw is None else psw[lo:hi]))
        assert torch.allclose(got, torch.cat(want, dim=1), atol=1e-5, rtol=1e-5), dtype
    assert kernel.memory_bytes() >= sum(b.nbytes for b in blocks)


def test_kernel_refuses_blocks_of_the_wrong_shape_or_dtype():
    kernel = QuantKernel(_kernel_spec([8], [10]), pooled=True, dtype="int8", device=torch.device("cpu"))
    good = quantize(torch.randn(10, 8), "int8")
    with pytest.raises(ValueError, match=r"expected torch.uint8 \[10, 8\]"):
        kernel.load_block(0, torch.zeros(10, 8), good.scale_bias)
    with pytest.raises(ValueError, match="need a scale_bias"):
        kernel.load_block(0, good.weight, None)
    with pytest.raises(ValueError, match=r"scale_bias float16 \[10, 2\]"):
        kernel.load_block(0, good.weight, good.scale_bias[:5])
