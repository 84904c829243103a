"""Redis that fails over (issue 34, item 3): behind ``redis+sentinel://`` URLs the stack
keeps serving when its master is SIGKILLed mid-run, loses no stream, and writes its state
through the promoted replica once the sentinels name it (docs/reliability.md)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sloserve.client import Client
from sloserve.services.drills.redis_server import SentinelRedis
from sloserve.services.drills.streams import start_streams
from sloserve.services.executor.backends import pseudo_token
from sloserve.services.preflight import check_redis
from sloserve.services.redisconn import SentinelURL, sync_client
from sloserve.services.rpc import service_parser
from sloserve.services.stack import Stack

RECOVER_S = 10.0  # the bound, from the kill


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    (tmp_path / "redis").mkdir()
    cluster = SentinelRedis(tmp_path / "redis")
    try:
        cluster.start(timeout=60)
        yield cluster
    finally:
        cluster.close()


@pytest.mark.parametrize(("url", "what"), [
    ("redis+sentinel://127.0.0.1:26379", "names no master"),
    ("redis+sentinel:///m/0", "names no sentinel"),
    ("redis+sentinel://h:0/m/0", "port '0' is not 1-65535"),
    ("redis+sentinel://h:1,h:two/m/0", "port 'two'"),
    ("redis+sentinel://h:1/m/db", "database 'db'"),
    ("redis+sentinel://h:1/m/0/extra", "more than /MASTER_NAME/DB"),
    ("redis+sentinel://h:1/m/0?ssl=1", "no query string"),
])
def test_malformed_sentinel_url_is_refused_naming_the_flag_and_what_is_wrong(
    url: str, what: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match=what):
        SentinelURL.parse(url)
    with pytest.raises(SystemExit) as exit_:
        service_parser("scheduler", port=1).parse_args(["--redis-url", url])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --redis-url: redis+sentinel URL: " in err and what in err, err
    with pytest.raises(ValueError, match=f"--redis-url: cannot parse .*{what}"):
        check_redis(url)  # up's preflight
    monkeypatch.setenv("REDIS_URL", url)
    with pytest.raises(ValueError, match=rf"\$REDIS_URL: cannot parse .*{what}"):
        check_redis(None)
    with pytest.raises(SystemExit):  # a service's default comes from $REDIS_URL
        service_parser("scheduler", port=1).parse_args([])
    assert "($REDIS_URL)" in capsys.readouterr().err


def test_sentinel_url_password_is_the_masters_and_is_masked() -> None:
    from sloserve.services.up_cmd import _masked

    u = SentinelURL.parse("redis+sentinel://:p%40ss@10.0.0.1:26379,[::1]:5,s3/prod/2")
    assert u.sentinels == (("10.0.0.1", 26379), ("::1", 5), ("s3", 26379))
    assert (u.master, u.db, u.password) == ("prod", 2, "p@ss")
    assert _masked("redis+sentinel://:p%40ss@h1:1,h2:2/prod/2") == \
        "redis+sentinel://:***@h1:1,h2:2/prod/2"


def test_up_preflight_pings_the_master_through_the_sentinels(
    sentinels: SentinelRedis,
) -> None:
    check_redis(sentinels.url)  # answers
    with pytest.raises(ValueError, match="--redis-url: cannot reach"):
        check_redis(sentinels.url.replace("/sloserve/", "/no-such-master/"), timeout=2)


def test_master_sigkilled_under_50_streams_fails_over_with_nothing_lost(
    sentinels: SentinelRedis, start_stack: Callable[..., Stack],
) -> None:  # (sentinels first: torn down after the stack)
    stack = start_stack(policy="sarathi", instances=2, redis_url=sentinels.url,
                        time_scale=3.0)
    n, max_tokens = 50, 150
    client = Client(stack.gateway)
    streams = start_streams(client, n, max_tokens, "failover")
    results, errors = streams.results, streams.errors
    old = sentinels.kill_master()
    t_kill = time.monotonic()
    # a new request, made right after the kill: served at once (from memory) ...
    probe = client.generate(prompt_token_ids=[70] * 20, max_tokens=2000, ttft_slo=60.0,
                            tbt_slo=60.0, request_id="failover-probe", timeout=120)
    first = next(probe)
    served_s = time.monotonic() - t_kill
    assert first.index == 0
    # ... and durable again once the promoted replica takes the scheduler's writes
    r = sync_client(sentinels.url, socket_connect_timeout=1, socket_timeout=1)
    durable_s = -1.0
    while time.monotonic() - t_kill < 30:
        try:
            if any(r.scan_iter(f"{stack.prefix}:inst:*:req:failover-probe")):
                durable_s = time.monotonic() - t_kill
                break
        except Exception:  # noqa: BLE001 - the master is down or not yet promoted
            pass
        time.sleep(0.05)
    new = sentinels.master()
    r.close()
    print(f"\nfailover: new request's first token {served_s:.2f} s after the kill; "
          f"its state on the promoted master ({new[1]}, was {old}) {durable_s:.2f} s after")
    client.cancel("failover-probe")  # cleanup: the probe has done its part
    probe.close()
    streams.join()

    assert new[1] != old
    assert served_s < RECOVER_S
    assert 0 <= durable_s < RECOVER_S
    assert not errors, errors[:3]
    assert len(results) == n
    for k, chunks in results.items():
        assert [c.token_id for c in chunks] == [
            pseudo_token(f"failover-{k}", i) for i in range(max_tokens)], k
        assert chunks[-1].finish_reason == "length"
    assert stack.exited() == []
    logs = stack.cfg.log_dir
    assert logs is not None
    for log in logs.glob("*.log"):
        text = log.read_text()
        assert "Traceback" not in text, log.name
        events = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
        down = sorted(e["task"] for e in events if e.get("event") == "redis_unavailable")
        back = sorted(e["task"] for e in events if e.get("event") == "redis_back")
        assert down == back, (log.name, down, back)  # every loop that lost Redis is back
