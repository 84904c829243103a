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
    """The Deployment's default refit clock (issue 32), the simulator's: a fit on the first
    samples (the warm-up sweep), then the REFIT_EVERY-th sample since refits, the one
    before does not; the fit says no period (``simulate``'s default)."""
    import redis.asyncio as aioredis

    from sloserve.batch import BatchSample, BatchShape
    from sloserve.deployment import REFIT_EVERY
    from sloserve.services.perfmodel import samples
    from sloserve.services.perfmodel.server import PerfModelService
    from sloserve.services.store import Keys

    async def run() -> tuple[list[int], float]:
        r = aioredis.Redis.from_url(redis_url())
        keys = Keys(f"test-refit-{uuid.uuid4().hex[:8]}")
        svc = PerfModelService("llama-3-8b", "a100", r, keys, None)
        task = asyncio.create_task(svc.consume(None))
        versions = []

        async def add(n: int) -> None:
            async with r.pipeline(transaction=True) as pipe:  # read as one, as a sweep is
                for k in range(n):
                    shape = BatchShape((), (100 + k % 50,))
                    pipe.xadd(keys.samples, samples.encode(BatchSample(shape, 0.02)))
                await pipe.execute()
            await asyncio.sleep(1.5)  # past one read's wait: every sample was read
            versions.append(svc.current.version)

        try:
            await add(20)  # the sweep: the first fit
            await add(REFIT_EVERY - 1)
            await add(1)
            return versions, svc.current.refit_interval_s
        finally:
            task.cancel()
            await r.delete(keys.samples, keys.coefficients)
            await r.aclose()

    versions, said = asyncio.run(run())
    assert (versions, said) == ([1, 1, 2], 0.0)
