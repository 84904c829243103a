"""Issue 2 acceptance: Ascendra's regression (eq. 4-5) fitted on 5 simulated
minutes of batch samples, evaluated on held-out later batches (MAPE).

Usage: python infra/experiments/regression_mape.py [--policy sarathi] [--model ...] [--gpu ...]
The samples are the simulator's executed batches, timed by the real-profile
ground truth (with its run-to-run noise); the regression never sees that function.
"""

from __future__ import annotations

import argparse
import json

from sloserve.perf.hardware import get_hardware
from sloserve.perf.models import get_model
from sloserve.perf.regression import AscendraRegression
from sloserve.sim.config import SimConfig
from sloserve.sim.simulator import Simulation


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="sarathi")
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--gpu", default="a100")
    ap.add_argument("--qps", type=float, default=1.5)
    ap.add_argument("--num-requests", type=int, default=3000)
    ap.add_argument("--train-minutes", type=float, default=5.0)
    a = ap.parse_args()
    cfg = SimConfig(policy=a.policy, model=a.model, gpu=a.gpu, qps=a.qps,
                    num_requests=a.num_requests, tbt_slo=0.15, record_samples=True)
    sim = Simulation(cfg)
    sim.run()
    cut = 60.0 * a.train_minutes
    train = [s for s, t in zip(sim.samples, sim.sample_times) if t < cut]
    test = [s for s, t in zip(sim.samples, sim.sample_times) if t >= cut]
    reg = AscendraRegression(get_model(a.model), get_hardware(a.gpu))
    reg.fit(train)
    print(json.dumps({
        "policy": a.policy, "model": a.model, "gpu": a.gpu, "qps": a.qps,
        "train_samples": len(train), "test_samples": len(test),
        "mape_holdout": round(reg.mape(test), 4), "mape_train": round(reg.mape(train), 4),
        "coefficients": [float(c) for c in reg.coefficients],
    }))


if __name__ == "__main__":
    main()
