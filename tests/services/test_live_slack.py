"""``slack`` on the live stack (sim backend): one burst of heterogeneous SLOs — decodes,
prompts whose TTFT SLO is near their prefill, prompts that never could make theirs — and
every stream ends with all its tokens, or a refusal that names the policy's rule."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from sloserve.client import Chunk, Client, RequestDropped
from sloserve.policies.slack import SlackConfig
from sloserve.services.proto import scheduler_grpc, scheduler_pb2
from sloserve.services.stack import Stack

# (prompt tokens, max tokens, TTFT SLO, TBT SLO) per kind of request
KINDS = [
    (64, 32, 1.0, 0.2),  # decodes
    (1500, 4, 0.15, 0.2),  # tight: a TTFT SLO near the prompt's own prefill
    (3000, 4, 0.01, 0.2),  # never could: deferred to the background lane, served late
]


def test_slack_serves_a_heterogeneous_burst_end_to_end(start_stack: Callable[..., Stack]
                                                        ) -> None:
    # admission=None: the gateway's own shedding of late requests is off, so every request
    # reaches the policy and its triage
    stack = start_stack(policy="slack", instances=1, admission=None)
    client = Client(stack.gateway)
    assert client.info()["policies"] == ["slack"]

    def one(k: int) -> tuple[list[Chunk] | None, str]:
        prompt, out, ttft, tbt = KINDS[k % len(KINDS)]
        try:
            return list(client.generate(prompt_token_ids=[97 + k % 26] * prompt,
                                        max_tokens=out, ttft_slo=ttft, tbt_slo=tbt,
                                        ignore_eos=True)), ""
        except RequestDropped as exc:
            return None, exc.details

    with ThreadPoolExecutor(18) as pool:
        results = list(pool.map(one, range(18)))
    for k, (chunks, refused) in enumerate(results):
        if chunks is None:
            assert "slack" in refused
            continue
        assert [c.index for c in chunks] == list(range(KINDS[k % len(KINDS)][1]))
        assert chunks[-1].finish_reason == "length"
    # a request that never could make its TTFT is deferred, not refused (late="triage")
    assert all(results[k][0] is not None for k in range(2, 18, len(KINDS)))
    assert sum(chunks is not None for chunks, _ in results) >= 12


@pytest.mark.parametrize("overlap", ["1", "0"])
def test_held_decodes_resume_on_the_policys_timer(
        start_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch, overlap: str
) -> None:
    """Decode pacing on the wall clock, in both scheduler loops: with a wide gate every
    arrival opens it, so after the prompt each decode-only iteration is held until its gap
    nears the TBT SLO. Nothing else arrives: only the scheduler's timer can run the held
    decodes, and the stream ends with gaps near the SLO instead of back-to-back
    iterations."""
    monkeypatch.setenv("SLOSERVE_OVERLAP", overlap)  # the schedulers' default loop
    cfg = SlackConfig(pace=1.0, pace_quantile=0.0, pace_gate=1e6)
    stack = start_stack(policy="slack", instances=1, admission=None, policy_config=cfg)
    client = Client(stack.gateway)
    seen: list[tuple[bool, int]] = []  # (idle, running) as Status reports them meanwhile
    loops: set[bool] = set()  # Status.overlap: which loop the scheduler ran
    done = threading.Event()

    def poll() -> None:
        with grpc.insecure_channel(stack.services["scheduler-lp0"].address) as ch:
            stub = scheduler_grpc.SchedulerStub(ch)
            while not done.is_set():
                st = stub.Status(scheduler_pb2.StatusRequest(),
                                 metadata=stack.internal_metadata)
                seen.append((st.idle, st.num_running))
                loops.add(st.overlap)
                time.sleep(0.01)

    watcher = threading.Thread(target=poll)
    watcher.start()
    try:
        times = [time.perf_counter() for _ in client.generate(
            prompt_token_ids=[97] * 64, max_tokens=8, ttft_slo=1.0, tbt_slo=0.2,
            ignore_eos=True, timeout=30.0)]  # a timer that never fires: the stream waits
    finally:
        done.set()
        watcher.join()
    assert len(times) == 8 and loops == {overlap == "1"}
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    assert gaps[len(gaps) // 2] > 0.1, gaps
    # a held decode is due: the scheduler is not idle while it waits for its timer
    assert any(running for _, running in seen)
    assert not any(idle and running for idle, running in seen)
