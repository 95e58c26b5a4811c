"""What the flash-attn adapters' lse mapping cost inside the timed call (session 18), H100.

Until session 18 the flash-attn adapters (FA2 / FA3 / FA4, and the vendor decode ones) turned
flash-attn's +inf lse on rows that see no key into the oracle's -inf inside ``run``: about eight small
kernels on every causal / window / varlen / decode call, timed as the backend's. The adapters now
declare ``lse_empty_rows`` and the checker maps it after the call. This script times flash-attn-4
through its adapter as it is (``after``) and with the former mapping put back into ``run``
(``before``), interleaved twice, min of the medians:

    python benchmarks/lse_mapping_ab.py decode    # every decode preset case, CUDA graphs, triton_decode beside
    python benchmarks/lse_mapping_ab.py softmax   # FA sweep causal cells, with and without CUDA graphs

Needs flash-attn-4 (the device's fa4-0 to fa4-N / .fa4-in carries: benchmarks/fa4_resplit.sh).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def _former_softmax_mapping(lse, case):
    """The flash-attn adapters' mapping before session 18, as it ran inside their timed call: the rows
    that see no key worked out on the device, +inf there turned into -inf."""
    left, right = case.window
    right = 0 if case.causal else right
    dev = lse.device

    def rows(sq: int, sk: int) -> torch.Tensor:
        i = torch.arange(sq, device=dev) + (sk - sq)
        lo = (i - left).clamp_min(0) if left >= 0 else torch.zeros_like(i)
        hi = (i + right + 1).clamp_max(sk) if right >= 0 else torch.full_like(i, sk)
        return hi <= lo

    if lse is None or not (case.causal or case.has_window or case.is_varlen):
        return lse
    if case.is_varlen:
        dead = torch.cat([rows(a, b) for a, b in case.varlen]).unsqueeze(0)
    else:
        dead = rows(case.seqlen_q, case.seqlen_k).unsqueeze(0).expand(case.batch, -1).unsqueeze(-2)
    return torch.where(dead & torch.isposinf(lse), torch.full_like(lse, -float("inf")), lse)


def _former_decode_mapping(lse, case, kv_lengths):
    """The vendor decode adapters' mapping before session 18 (inside their timed call)."""
    left, right = case.window
    right = 0 if case.causal else right
    n = kv_lengths.to(lse.device).long()[:, None]
    pos = n - case.seqlen_q + torch.arange(case.seqlen_q, device=lse.device)[None, :]
    lo = (pos - left).clamp_min(0) if left >= 0 else torch.zeros_like(pos)
    hi = torch.minimum(pos + right + 1, n) if right >= 0 else n.expand_as(pos)
    empty = (hi <= lo)[:, None, :]
    return torch.where(empty & torch.isposinf(lse), torch.full_like(lse, float("-inf")), lse)


SOFTMAX_CASES = ["B16-H16-S1024x1024-D128-causal-bf16", "B16-H32-S1024x1024-D64-causal-bf16",
                 "B4-H16-S4096x4096-D128-causal-bf16", "B1-H16-S16384x16384-D128-causal-bf16"]


def _best(adapters: dict, case, options, repeats: int = 2) -> dict:
    from harness.perf.timing import time_adapter

    dev = torch.device("cuda")
    t: dict = {}
    for _ in range(repeats):
        for name, a in adapters.items():
            t[name] = min(t.get(name, float("inf")), time_adapter(a, case, "fwd", device=dev, options=options).median_ms)
    return t


def decode() -> None:
    from harness.adapters import registry
    from harness.adapters.decode import FlashAttnCuteDecode
    from harness.perf.timing import TimerOptions
    from harness.presets import preset

    class Before(FlashAttnCuteDecode):
        name = "flash_attn_cute_decode_before"

        def run(self, case, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None):
            res = super().run(case, q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                              block_table=block_table, k=k, v=v)
            res.lse = _former_decode_mapping(res.lse, case, cache_seqlens + (k.shape[1] if k is not None else 0))
            return res

    adapters = {"after": FlashAttnCuteDecode(), "before": Before(), "ours": registry.get("triton_decode")}
    dev = torch.device("cuda")
    print("| case | FA4 after (us) | FA4 before (us) | before / after | triton_decode (us) | ours vs FA4 after "
          "| ours vs FA4 before |")
    print("|---|---|---|---|---|---|---|")
    for case in preset("decode"):
        if any(a.supports(case, dev) for a in adapters.values()):
            continue
        t = _best(adapters, case, TimerOptions(cuda_graph=True))
        print(f"| {case.id} | {t['after'] * 1e3:.1f} | {t['before'] * 1e3:.1f} | {t['before'] / t['after']:.2f} | "
              f"{t['ours'] * 1e3:.1f} | {t['after'] / t['ours']:.2f} | {t['before'] / t['ours']:.2f} |", flush=True)


def softmax() -> None:
    from harness.adapters.flash_attn import FlashAttnCute
    from harness.cases import case_from_id
    from harness.perf.timing import TimerOptions

    class Before(FlashAttnCute):
        name = "flash_attn_cute_before"

        def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
            res = super().run(case, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
            res.lse = _former_softmax_mapping(res.lse, case)
            return res

    adapters = {"after": FlashAttnCute(), "before": Before()}
    print("| case | CUDA graphs | FA4 after (ms) | FA4 before (ms) | before / after |")
    print("|---|---|---|---|---|")
    for cid in SOFTMAX_CASES:
        for graphs in (False, True):
            t = _best(adapters, case_from_id(cid), TimerOptions(cuda_graph=graphs))
            print(f"| {cid} | {graphs} | {t['after']:.4f} | {t['before']:.4f} | {t['before'] / t['after']:.2f} |",
                  flush=True)


def main(argv=None) -> int:
    which = (argv if argv is not None else sys.argv[1:]) or ["decode", "softmax"]
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (an H100) and flash-attn-4")
        return 2
    for part in which:
        {"decode": decode, "softmax": softmax}[part]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
