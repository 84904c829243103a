"""The sim executor's warm-up sweep times batches as its ``execute`` does."""

from __future__ import annotations

import pytest

from sloserve.services.executor.backends import SimBackend


def test_the_warmup_sweep_is_slowed_by_time_scale_like_every_executed_batch() -> None:
    base = SimBackend("llama-3-8b", "a100", noise_cv=0.0).warmup_samples()
    slow = SimBackend("llama-3-8b", "a100", noise_cv=0.0, time_scale=4.0).warmup_samples()
    assert [s.shape for s in slow] == [s.shape for s in base]
    assert [s.duration for s in slow] == pytest.approx([4.0 * s.duration for s in base])


@pytest.mark.parametrize("instance", [0, 2])
def test_instance_k_draws_the_noise_and_sweep_simulate_replays_for_it(instance: int) -> None:
    """Executor ``k`` of a stack seeded 7 times batches as ``simulate --noise-streams
    instance --noise-seed 7`` times instance ``k``'s, and profiles on the simulator's
    sweep: the same factors for the same batches (what ``bench --compare-sim`` relies on)."""
    from sloserve.batch import BatchShape
    from sloserve.perf.models import get_model
    from sloserve.perf.sweep import profile_sweep
    from sloserve.sim.config import SimConfig
    from sloserve.sim.simulator import build_timing, instance_timings

    cfg = SimConfig(policy="ascendra", instances=3, hp_instances=1, seed=4, noise_seed=7,
                    noise_streams="instance")
    truth = build_timing(cfg)
    sweep = profile_sweep(truth, get_model(cfg.model), seed=cfg.truth_seed)
    sim_k = instance_timings(cfg, truth, [0, 1, 2])[instance]
    live = SimBackend("llama-3-8b", "a100", seed=7, instance=instance)
    assert live.warmup_samples() == sweep
    shapes = [BatchShape(prefills=((300 + 10 * i, 0),), decodes=(500,) * i)
              for i in range(20)]
    assert [live.timing.batch_time(s) for s in shapes] == [sim_k.batch_time(s) for s in shapes]
    # another instance's stream gives other factors
    other = SimBackend("llama-3-8b", "a100", seed=7, instance=instance + 1)
    assert [other.timing.batch_time(s) for s in shapes] != [
        SimBackend("llama-3-8b", "a100", seed=7, instance=instance).timing.batch_time(s)
        for s in shapes]
    assert live.describe().noise_stream == f"7/instance/{instance}"


def test_a_negative_instance_index_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"instance \(--instance\): must be >= 0"):
        SimBackend("llama-3-8b", "a100", instance=-1)
