"""Estimator constant presets: ``sloserve plan --hardware NAME`` (docs/bestserve.md).

* ``ascend-910b3``: the paper's constants -- §4.1's efficiencies and Table 3's
  dispatch times and 0.1 ms per all-reduce, measured on Ascend 910B3 NPUs.
* ``a100``, ``h100``: ``e_c``/``e_m`` per phase and the three dispatch times fitted
  to the GPU profiles we ship (``sloserve.plan.calibrate``; a test re-fits and
  compares). The profiles hold no collective, so ``e_+`` stays the paper's and the
  all-reduce floor is a small NCCL all-reduce's latency, 0.043 ms (median of a
  2 KB all-reduce on an A100 DGX in Vidur's network profile,
  ``data/profiling/network/a100_dgx/all_reduce.csv``; not shipped, not fitted),
  used for both GPUs.

The preset sets constants only; peak FLOP/s and bandwidth stay those of ``--gpu``.
"""

from __future__ import annotations

from sloserve.defaults import GPU
from sloserve.perf.hardware import get_hardware
from sloserve.plan.estimator import Efficiency, EstimatorConfig

PAPER = "ascend-910b3"
AUTO = "auto"
ALLREDUCE_FLOOR_GPU = 0.043e-3  # s, see the module docstring

PRESETS: dict[str, EstimatorConfig] = {
    PAPER: EstimatorConfig(),
    # python -m sloserve.plan.calibrate a100 h100 (MAPE: docs/bestserve.md)
    "a100": EstimatorConfig(
        prefill=Efficiency(0.7375, 1.0, 0.6), decode=Efficiency(0.5375, 0.7375, 0.3),
        dispatch_rmsnorm=0.0, dispatch_attention=0.013e-3, dispatch_mlp=0.0,
        allreduce_floor=ALLREDUCE_FLOOR_GPU),
    "h100": EstimatorConfig(
        prefill=Efficiency(0.8, 0.875, 0.6), decode=Efficiency(0.5375, 0.65, 0.3),
        dispatch_rmsnorm=0.0, dispatch_attention=0.0, dispatch_mlp=0.033e-3,
        allreduce_floor=ALLREDUCE_FLOOR_GPU),
}


def preset_names() -> list[str]:
    return [AUTO, *sorted(PRESETS)]


def resolve_preset(name: str, gpu: str) -> str:
    """``auto``: the calibrated preset of ``gpu`` (its canonical name); any other name as is.
    Raises ``ValueError`` naming ``hardware`` for an unknown name, or for ``auto`` on a GPU
    that has no calibration."""
    key = name.lower()
    if key == AUTO:
        hw = get_hardware(gpu).name
        if hw not in PRESETS:
            raise ValueError(f"hardware: no calibrated preset for gpu {gpu!r}; choose one of "
                             f"{sorted(PRESETS)} explicitly")
        return hw
    if key not in PRESETS:
        raise ValueError(f"hardware: unknown preset {name!r}; choose one of {preset_names()}")
    return key


def get_preset(name: str, gpu: str = GPU) -> EstimatorConfig:
    """The ``EstimatorConfig`` of preset ``name`` (``auto`` resolved against ``gpu``)."""
    return PRESETS[resolve_preset(name, gpu)]
