"""Published dense peak tensor-core rates of named GPUs, and the matmul speedup a set of
per-layer formats could reach on them: an *estimate*, never a measurement.

The rates are NVIDIA's datasheet numbers for dense (not 2:4 sparse) matrix maths, in
TFLOPS: H100 SXM5 (bf16 989, fp8 1979; no MX or NVFP4 in hardware) and B200 (HGX B200,
per GPU: bf16 2250, fp8 and MXFP8 4500, MXFP4 and NVFP4 9000). The estimate assumes
every Linear GEMM (forward and both backward GEMMs) runs at its format's peak: it leaves
out everything else in a step (attention's own matmuls, norms, the optimizer, the
quantisation kernels), so a real step gains less.
"""
from __future__ import annotations

from collections.abc import Mapping

#: GPU -> format -> dense peak TFLOPS (bf16 is what the other layers run in).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100": {"bf16": 989.0, "fp8": 1979.0, "fp8-rowwise": 1979.0,
             "fp8-rowwise-gw-hp": 1979.0, "fp8-blockwise": 1979.0},
    "B200": {"bf16": 2250.0, "fp8": 4500.0, "fp8-rowwise": 4500.0,
             "fp8-rowwise-gw-hp": 4500.0, "fp8-blockwise": 4500.0, "mxfp8": 4500.0,
             "mxfp4": 9000.0, "nvfp4": 9000.0, "nvfp4-plain": 9000.0},
}
#: What the reports call these numbers.
ESTIMATE_LABEL = ("estimate: the Linear layers' GEMMs at each format's published dense "
                  "peak rate, the rest of the step not counted")


def matmul_speedup_estimate(flops: Mapping[str, int], formats: Mapping[str, str],
                            gpu: str) -> float | None:
    """The Linear GEMMs' time in bf16 over their time with each layer in ``formats[layer]``
    (``bf16`` where absent) at ``gpu``'s peak rates; None when ``gpu`` has no hardware
    for one of the formats (MXFP4 on an H100)."""
    peaks = PEAK_TFLOPS[gpu]
    if any(fmt not in peaks for fmt in formats.values()):
        return None
    bf16 = sum(flops.values()) / peaks["bf16"]
    mixed = sum(f / peaks[formats.get(name, "bf16")] for name, f in flops.items())
    return bf16 / mixed if mixed else None


def speed_estimates(flops: Mapping[str, int], formats: Mapping[str, str]
                    ) -> dict[str, float | None]:
    """:func:`matmul_speedup_estimate` on every GPU of :data:`PEAK_TFLOPS`."""
    return {gpu: matmul_speedup_estimate(flops, formats, gpu) for gpu in PEAK_TFLOPS}
