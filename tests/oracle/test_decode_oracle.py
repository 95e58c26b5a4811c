"""The FP64 decode oracle (``harness.oracle.decode_attention``) against a direct computation: each
sequence's keys walked position by position through the page table, then the dense softmax oracle."""

import pytest
import torch

from harness.cases import make_decode_inputs
from harness.oracle import softmax_attention
from harness.oracle.decode import decode_attention
from harness.presets import preset


def _direct(case, x):
    """Each sequence's keys read position by position, the new tokens appended, then the dense
    FP64 softmax oracle on that one sequence."""
    outs = []
    page = case.page_size
    for b in range(case.batch):
        n = int(x.cache_seqlens[b])
        ks, vs = [], []
        for p in range(n):
            if case.paged:
                blk = int(x.block_table[b, p // page])
                ks.append(x.k_cache[blk, p % page])
                vs.append(x.v_cache[blk, p % page])
            else:
                ks.append(x.k_cache[b, p])
                vs.append(x.v_cache[b, p])
        if case.append:
            ks += list(x.k[b])
            vs += list(x.v[b])
        if not ks:
            outs.append(torch.zeros(1, case.seqlen_q, case.heads_q, case.d_v, dtype=torch.float64))
            continue
        k, v = torch.stack(ks)[None].double(), torch.stack(vs)[None].double()
        outs.append(softmax_attention(x.q[b : b + 1].double(), k, v, **case.oracle_kwargs).out)
    return torch.cat(outs)


@pytest.mark.parametrize("case", preset("small-decode"), ids=str)
def test_oracle_matches_direct_computation(case):
    x = make_decode_inputs(case, seed=1)
    ref = decode_attention(**x.tensors(), **case.oracle_kwargs)
    torch.testing.assert_close(ref.out, _direct(case, x), rtol=1e-12, atol=1e-12)
    if case.append:  # the written cache holds the new tokens where the direct walk found them
        assert not torch.equal(ref.k_cache, x.k_cache)
    else:
        assert torch.equal(ref.k_cache, x.k_cache)
