"""The perf-model service's refit period: what it says in its fits, and a bad one refused."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis_source import redis_url

from sloserve.services.deployment_flags import resolve_into
from sloserve.services.perfmodel.server import build_parser


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon"])
def test_a_refit_interval_that_is_not_a_positive_number_is_refused_naming_the_flag(
        bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--port", "1", "--refit-interval", bad])
    assert exc.value.code == 2
    assert "--refit-interval" in capsys.readouterr().err


def test_a_refit_interval_in_seconds_is_taken() -> None:
    parse = build_parser().parse_args
    assert parse(["--port", "1", "--refit-interval", "0.25"]).refit_interval == 0.25
    # unset: the Deployment's default, a refit every REFIT_EVERY batches, as the simulator
    assert resolve_into(parse(["--port", "1"])).refit_interval is None


def test_without_an_interval_the_service_refits_every_refit_every_batches_as_the_simulator(
) -> None:
    """The Deployment's default refit clock (issue 32): the 512th sample since the last
    fit refits, the 511th does not, and the fit says no period (``simulate``'s default)."""
    import redis.asyncio as aioredis

    from sloserve.batch import BatchSample, BatchShape
    from sloserve.deployment import REFIT_EVERY
    from sloserve.services.perfmodel import samples
    from sloserve.services.perfmodel.server import PerfModelService
    from sloserve.services.store import Keys

    async def run() -> tuple[int, int, float]:
        r = aioredis.Redis.from_url(redis_url())
        keys = Keys(f"test-refit-{uuid.uuid4().hex[:8]}")
        svc = PerfModelService("llama-3-8b", "a100", r, keys, None)
        task = asyncio.create_task(svc.consume(None))

        async def add(n: int) -> None:
            for k in range(n):
                shape = BatchShape((), (100 + k % 50,))
                await r.xadd(keys.samples, samples.encode(BatchSample(shape, 0.02)))

        try:
            await add(REFIT_EVERY - 1)
            await asyncio.sleep(1.5)  # past one read's wait: every sample was read
            before = svc.current.version
            await add(1)
            for _ in range(50):
                if svc.current.version > before:
                    break
                await asyncio.sleep(0.1)
            return before, svc.current.version, svc.current.refit_interval_s
        finally:
            task.cancel()
            await r.delete(keys.samples, keys.coefficients)
            await r.aclose()

    before, after, said = asyncio.run(run())
    assert (before, after, said) == (0, 1, 0.0)
