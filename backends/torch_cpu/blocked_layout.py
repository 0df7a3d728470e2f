"""The blocked weight layouts of the AVX-512 kernels, converted from the canonical formats at
load time, and their rows back as float32 (embedding lookups, prefill tiles, dequantize()).

Both put 16 output rows side by side, so one AVX-512 multiply-add serves 16 rows and each block's
result is 16 finished dot products (no horizontal sums); the kernels are in kernels/int4_avx512*
and, with VNNI, kernels/vnni8_avx512.cpp.

int4: codes uint8 [blocks, groups, 16 chunks, 16 rows, 2]: byte j of chunk c holds input
4c + j of its group in the low nibble and input 4c + 2 + j in the high one; scale and zero
float16 [blocks, groups, 16]. Same bytes as the canonical layout, in another order.
int8 (and bfloat16): codes [blocks, K / 2, 16 rows, 2 inputs]; int8's scale float32 [blocks * 16].
int6: codes uint8 [blocks, groups, 4, 3, 64]: a group's 16 operands (inputs 4p .. 4p + 3 of its 16
rows, 64 bytes; unsigned codes u = c + 32) by fours, operands 4h + k in 3 vectors: the first
holding u & 15 of k = 0 (low halves) and u >> 2 of k = 1 (high halves), the second the same for
k = 2 and 3, the third u & 3 of k = 1 and 3 in bits 0-1 and 2-3 and u >> 4 of k = 0 and 2 in bits
4-5 and 6-7: the order in which the VNNI kernel reads them and rebuilds each operand with one
bitwise select; scale float16 [blocks, groups, 16].
Rows past N (to fill the last block) are zeros.
"""
from __future__ import annotations

import torch

from qwen_serve.quant.int4 import GROUP, Int4Weight

BLOCK = 16


def _pad_rows(t: torch.Tensor) -> torch.Tensor:
    extra = -t.shape[0] % BLOCK
    return t if extra == 0 else torch.cat((t, t.new_zeros((extra, *t.shape[1:]))))


def block_int4(weight: Int4Weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cols = weight.shape
    groups = cols // GROUP
    packed = torch.from_numpy(weight.packed)
    codes = _pad_rows(torch.stack((packed & 0x0F, packed >> 4), dim=-1).view(rows, cols))
    quads = codes.view(-1, BLOCK, groups, 16, 4)  # [block, row, group, chunk, 4 inputs]
    paired = quads[..., 0:2] | (quads[..., 2:4] << 4)
    blocked = paired.permute(0, 2, 3, 1, 4).contiguous()

    return blocked, _per_block(torch.from_numpy(weight.scale)), _per_block(torch.from_numpy(weight.zero))


def _per_block(t: torch.Tensor) -> torch.Tensor:
    """Per-row, per-group values [N, groups] -> [blocks, groups, 16 rows] (scales, zero points)."""
    return _pad_rows(t).view(-1, BLOCK, t.shape[1]).transpose(1, 2).contiguous()


def unblock_int4(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, rows: int) -> Int4Weight:
    """The inverse of block_int4: the canonical weight of its first ``rows`` rows."""
    blocks, groups = codes.shape[0], codes.shape[1]
    paired = codes.permute(0, 3, 1, 2, 4)  # [block, row, group, chunk, 2]
    quads = torch.cat((paired & 0x0F, paired >> 4), dim=-1).reshape(blocks * BLOCK, -1)[:rows]
    packed = quads[:, 0::2] | (quads[:, 1::2] << 4)  # low nibble first

    def per_row(t: torch.Tensor):
        return t.transpose(1, 2).reshape(blocks * BLOCK, groups)[:rows].contiguous().numpy()

    return Int4Weight(packed.contiguous().numpy(), per_row(scale), per_row(zero))


def int4_rows(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of a blocked int4 weight as float32 [len(ids), K]."""
    block, lane = ids // BLOCK, ids % BLOCK
    picked = codes[block, :, :, lane, :]  # [n, groups, 16 chunks, 2]
    q = torch.stack((picked & 0x0F, picked >> 4), dim=-2).view(len(ids), -1, GROUP).float()
    s, z = scale[block, :, lane].float(), zero[block, :, lane].float()
    return (q * s[..., None] + z[..., None]).view(len(ids), -1)


def int4_block_rows(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, first: int, stop: int,
                    out: torch.Tensor) -> None:
    """Blocks [first, stop) as float32 rows into out [(stop - first) * 16, K]."""
    n, groups = stop - first, codes.shape[1]
    part = codes[first:stop]
    q = torch.stack((part & 0x0F, part >> 4), dim=-2)  # [n, groups, chunk, row, 2 nibbles, 2]
    q = q.permute(0, 3, 1, 2, 4, 5).reshape(n * BLOCK, groups, GROUP)
    s = scale[first:stop].transpose(1, 2).reshape(n * BLOCK, groups, 1)
    z = zero[first:stop].transpose(1, 2).reshape(n * BLOCK, groups, 1)
    torch.addcmul(z.float(), q.float(), s.float(), out=out.view(n * BLOCK, groups, GROUP))


def block_pairs(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [blocks, K / 2, 16 rows, 2 inputs], any dtype (the int8 and bf16 kernels)."""
    cols = weight.shape[1]
    return _pad_rows(weight).view(-1, BLOCK, cols // 2, 2).permute(0, 2, 1, 3).contiguous()


def pair_rows(blocked: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of a block_pairs layout, in its dtype [len(ids), K]."""
    return blocked[ids // BLOCK, :, ids % BLOCK, :].reshape(len(ids), -1)


def block_columns(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [blocks, K, 16 rows] (the float32 kernel)."""
    return _pad_rows(weight).view(-1, BLOCK, weight.shape[1]).transpose(1, 2).contiguous()


def column_rows(blocked: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of a block_columns layout [len(ids), K]."""
    return blocked[ids // BLOCK, :, ids % BLOCK]


def block_int8(codes: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return block_pairs(codes), _pad_rows(scale)


def int8_rows(codes: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return pair_rows(codes, ids).float() * scale[ids, None]


INT6_GROUP_BYTES = 768


def block_int6(codes: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes [N, K] in -32..31 and float16 scales [N, K / 64] -> the blocked int6 layout."""
    groups = codes.shape[1] // GROUP
    unsigned = (_pad_rows(codes).to(torch.int16) + 32).to(torch.uint8)
    # [block, group, h, k, row, 4 inputs]: operand 4h + k
    u = unsigned.view(-1, BLOCK, groups, 4, 4, 4).permute(0, 2, 3, 4, 1, 5)
    blocks = u.shape[0]
    nibbles = torch.stack(((u[:, :, :, 0] & 0x0F) | ((u[:, :, :, 1] >> 2) << 4),
                           (u[:, :, :, 2] & 0x0F) | ((u[:, :, :, 3] >> 2) << 4)), dim=3)
    pairs = (u[:, :, :, 1] & 3) | ((u[:, :, :, 3] & 3) << 2) | ((u[:, :, :, 0] >> 4) << 4) | ((u[:, :, :, 2] >> 4) << 6)
    packed = torch.cat((nibbles, pairs[:, :, :, None]), dim=3)  # [block, group, h, 3 vectors, row, 4]
    return packed.reshape(blocks, groups, INT6_GROUP_BYTES).contiguous(), _per_block(scale)


def int6_rows(codes: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of a blocked int6 weight as float32 [len(ids), K]."""
    block, lane = ids // BLOCK, ids % BLOCK
    n, groups = len(ids), codes.shape[1]
    picked = codes.view(-1, groups, 4, 3, BLOCK, 4)[block, :, :, :, lane, :]  # [n, group, h, 3 vectors, 4]
    nibbles, pairs = picked[:, :, :, :2], picked[:, :, :, 2]
    u = torch.stack(((nibbles[:, :, :, 0] & 0x0F) | (((pairs >> 4) & 3) << 4),
                     ((nibbles[:, :, :, 0] >> 4) << 2) | (pairs & 3),
                     (nibbles[:, :, :, 1] & 0x0F) | ((pairs >> 6) << 4),
                     ((nibbles[:, :, :, 1] >> 4) << 2) | ((pairs >> 2) & 3)), dim=3)  # [n, group, h, k, 4]
    signed = u.view(n, groups, GROUP).float() - 32
    return (signed * scale[block, :, lane].float()[..., None]).view(n, -1)
