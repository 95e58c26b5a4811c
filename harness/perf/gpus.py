"""What a named GPU can do at most: dense tensor-core TFLOP/s per dtype, memory bandwidth, memory.

The table the audit (:mod:`harness.perf.audit`) holds published claims against. Every figure is
the vendor's, dense (the datasheets print "with sparsity" figures; those are halved here), at the
boost clock the vendor states; each entry names its source document. Two rates per dtype:

* ``fp32acc``: tensor cores accumulating in fp32, what a correct attention kernel uses (the
  tolerance rule rejects fp16 accumulation); a claim above 85% of it is implausible;
* ``max``: the fastest mode of the chip for that input dtype (GeForce parts run fp16 inputs twice
  as fast with fp16 accumulation); a claim above it is impossible whatever the kernel does.

"fp32" inputs: the larger of the TF32 tensor rate and the fp32 CUDA-core rate (Triton's fp32 dot
uses TF32 by default). None: the chip has no such mode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: A claim above this fraction of the fp32-accumulate peak (or of the bandwidth) is implausible.
IMPLAUSIBLE_FRACTION = 0.85


@dataclass(frozen=True)
class GPU:
    """One GPU's ceilings. ``tflops[dtype] = (fp32acc, max)`` dense TFLOP/s; ``bandwidth_gbps`` GB/s;
    ``memory_gb`` decimal GB; ``sources`` the documents the figures come from; ``note`` caveats."""

    name: str
    pattern: str  # regex over the published name (case-insensitive)
    tflops: dict[str, tuple[float, float] | None]
    bandwidth_gbps: float
    memory_gb: float
    sources: tuple[str, ...]
    note: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)

    def peak(self, dtype: str) -> tuple[float, float] | None:
        return self.tflops.get(dtype)

    def to_dict(self) -> dict:
        return {"name": self.name, "tflops": {k: list(v) if v else None for k, v in self.tflops.items()},
                "bandwidth_gbps": self.bandwidth_gbps, "memory_gb": self.memory_gb, "sources": list(self.sources),
                "note": self.note}


_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com, 2023): SXM and PCIe columns; sparsity figures halved"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com, 2021): SXM columns; sparsity figures halved"
_ADA_WP = "NVIDIA Ada GPU Architecture whitepaper v2.1 (2023), Appendix A: GeForce RTX 4090 peak rates"

#: Order matters: the first pattern that matches a published name wins (H100 PCIe before H100).
GPUS: tuple[GPU, ...] = (
    GPU("A100 40GB", r"A100(?!.*80)", {"fp16": (312.0, 312.0), "bf16": (312.0, 312.0), "fp32": (156.0, 156.0),
                                       "fp8": None}, 1555.0, 40.0, (_A100_DS,)),
    GPU("A100 80GB", r"A100.*80", {"fp16": (312.0, 312.0), "bf16": (312.0, 312.0), "fp32": (156.0, 156.0),
                                   "fp8": None}, 2039.0, 80.0, (_A100_DS,),
        note="SXM; the PCIe 80GB card has 1,935 GB/s"),
    GPU("H100 PCIe", r"H100.*PCIe", {"fp16": (756.5, 756.5), "bf16": (756.5, 756.5), "fp32": (378.0, 378.0),
                                     "fp8": (1513.0, 1513.0)}, 2000.0, 80.0, (_H100_DS,)),
    GPU("H100 SXM", r"H100", {"fp16": (989.4, 989.4), "bf16": (989.4, 989.4), "fp32": (494.7, 494.7),
                              "fp8": (1978.9, 1978.9)}, 3350.0, 80.0, (_H100_DS,),
        note="an H100 named without PCIe is taken as the SXM5 part (torch names it 'NVIDIA H100 80GB HBM3')"),
    GPU("H200", r"H200", {"fp16": (989.4, 989.4), "bf16": (989.4, 989.4), "fp32": (494.7, 494.7),
                          "fp8": (1978.9, 1978.9)}, 4800.0, 141.0,
        ("NVIDIA H200 Tensor Core GPU datasheet (nvidia.com, 2024): H200 SXM column; sparsity figures halved",)),
    GPU("A10G", r"A10G|A10\b", {"fp16": (125.0, 125.0), "bf16": (125.0, 125.0), "fp32": (62.5, 62.5), "fp8": None},
        600.0, 24.0, ("NVIDIA A10 Tensor Core GPU datasheet (nvidia.com, 2021); sparsity figures halved",),
        note="AWS's A10G is a variant of the A10 whose own rates NVIDIA does not publish; the A10's are used"),
    GPU("L4", r"\bL4\b", {"fp16": (121.0, 121.0), "bf16": (121.0, 121.0), "fp32": (60.0, 60.0),
                          "fp8": (242.5, 242.5)}, 300.0, 24.0,
        ("NVIDIA L4 Tensor Core GPU datasheet (nvidia.com, 2023); sparsity figures halved",)),
    GPU("RTX 4060 Laptop", r"4060.*(Laptop|Mobile)", {"fp16": (29.1, 58.2), "bf16": (29.1, 29.1),
                                                      "fp32": (14.6, 14.6), "fp8": (58.2, 116.5)},
        256.0, 8.0,
        ("NVIDIA GeForce RTX 40 Series Laptops specifications (nvidia.com): 3,072 CUDA cores (24 SMs), boost up "
         "to 2,370 MHz at the highest TGP, 8 GB GDDR6 on 128 bits at 16 Gbps (256 GB/s)",
         _ADA_WP + ": per-SM, per-clock tensor rates scaled to 24 SMs at 2,370 MHz"),
        note="NVIDIA publishes no tensor TFLOP/s for this part; the rates are the Ada per-SM rates at the "
             "highest boost clock (laptops with a lower TGP clock lower)"),
    GPU("RTX 4090", r"4090", {"fp16": (165.2, 330.3), "bf16": (165.2, 165.2), "fp32": (82.6, 82.6),
                              "fp8": (330.3, 660.6)}, 1008.0, 24.0, (_ADA_WP,)),
    GPU("RTX 5090", r"5090", {"fp16": (209.5, 419.2), "bf16": (209.5, 209.5), "fp32": (104.8, 104.8),
                              "fp8": (419.2, 838.4)}, 1792.0, 32.0,
        ("NVIDIA RTX Blackwell GPU Architecture whitepaper (2025), Appendix: GeForce RTX 5090 peak rates",)),
    GPU("B200", r"B200", {"fp16": (2250.0, 2250.0), "bf16": (2250.0, 2250.0), "fp32": (1100.0, 1100.0),
                          "fp8": (4500.0, 4500.0)}, 7700.0, 180.0,
        ("NVIDIA HGX B200 datasheet (nvidia.com, 2025): per-GPU figures; sparsity figures halved",)),
)


def lookup(name: str) -> GPU | None:
    """The table's entry for a published GPU name ("NVIDIA H100 80GB SXM5", "RTX 4060 Laptop"), or None."""
    for gpu in GPUS:
        if re.search(gpu.pattern, name or "", flags=re.IGNORECASE):
            return gpu
    return None
