"""The OpenAI-compatible HTTP API on a live sim stack, driven by the official ``openai``
client and raw HTTP: shapes, usage, errors, SLO fields and headers, stop strings,
metrics with vLLM's names, the per-request log line."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from sloserve.client import Client
from sloserve.services.gateway.validate import MAX_MESSAGE_BYTES
from sloserve.services.stack import Stack
from sloserve.services.store import free_port

MODEL = "llama-3-8b"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture
def stack(start_stack: Callable[..., Stack]) -> Stack:
    return start_stack(http_port=free_port(), metrics=True, time_scale=0.02)


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.http + "/v1", api_key="unused", max_retries=0)


def test_openai_client_streams_a_chat_ending_with_usage_and_done(stack: Stack) -> None:
    stream = _client(stack).chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) == 6  # the sim's tokens are single ASCII bytes
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    raw = httpx.post(stack.http + "/v1/completions",
                     json={"prompt": "abc", "max_tokens": 3, "stream": True}).text
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    # tokens ready at once share an event (vLLM's too): 3 tokens in 1 to 3 events
    data = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert 1 <= len(data) <= 3
    assert len("".join(d["choices"][0]["text"] for d in data)) == 3
    assert [d["choices"][0]["finish_reason"] for d in data][-1] == "length"


def test_non_streamed_chat_has_usage_counting_the_chatml_prompt(stack: Stack) -> None:
    r = _client(stack).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5)
    chatml = "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(chatml.encode()), 5)
    assert r.usage.total_tokens == len(chatml.encode()) + 5
    c = _client(stack).completions.create(model=MODEL, prompt="hello", max_tokens=4)
    assert c.usage is not None and c.usage.prompt_tokens == 5 and len(c.choices[0].text) == 4


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "ttft_slo_ms": "soon"}, 400, "ttft_slo_ms"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": "x", "model": "llama-99b"}, 404, "model"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": "x", "stream": True, "stream_options": True}, 400, "stream_options"),
])
def test_bad_requests_get_openai_error_json(stack: Stack, body: dict[str, object], status: int,
                                            param: str) -> None:
    r = httpx.post(stack.http + "/v1/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["message"].startswith(param)


def test_a_body_over_the_message_limit_is_refused_unread_with_400(stack: Stack) -> None:
    limit = MAX_MESSAGE_BYTES  # the gateway's default, the gRPC API's bound
    big = json.dumps({"prompt": "x" * (limit + 1), "max_tokens": 1}).encode()
    # with a Content-Length: refused before the body is read; chunked: once it passes it
    for content in (big, iter([big[:limit // 2], big[limit // 2:]])):
        r = httpx.post(stack.http + "/v1/completions", content=content, timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "body" and f"limit of {limit} bytes" in err["message"]
    ok = httpx.post(stack.http + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert ok.status_code == 200  # and the gateway serves on


def test_openai_client_raises_its_own_error_types(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError, match="unknown_field: not supported"):
        _client(stack).chat.completions.create(model=MODEL, messages=CHAT,
                                               extra_body={"unknown_field": 1})
    with pytest.raises(openai.NotFoundError):
        _client(stack).chat.completions.create(model="nope", messages=CHAT)


def test_fields_only_vllm_samples_are_400_naming_the_backend_on_sim(stack: Stack) -> None:
    """Issue 35, item 2: never ignored; a neutral value (vllm bench's repetition_penalty 1)
    changes nothing and is served."""
    client = _client(stack)
    for extra in ({"logprobs": True}, {"presence_penalty": 0.5}, {"min_tokens": 2},
                  {"response_format": {"type": "json_object"}}):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2,
                                           extra_body=extra)
        body = err.value.body
        assert isinstance(body, dict) and "vllm backend only" in body["message"], body
        assert body["param"] == next(iter(extra)), body
    ok = client.completions.create(model=MODEL, prompt=["ab", "cd"], n=2, max_tokens=3,
                                   extra_body={"repetition_penalty": 1.0})
    assert [c.index for c in ok.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" for c in ok.choices)
    assert ok.usage is not None and ok.usage.completion_tokens == 12


def test_stop_string_ends_the_output_before_it(stack: Stack) -> None:
    def complete(**extra: object) -> dict[str, object]:
        body = {"prompt": "abc", "max_tokens": 40, **extra}
        r = httpx.post(stack.http + "/v1/completions", json=body,
                       headers={"x-request-id": "same-id"})  # the sim's tokens follow the id
        assert r.status_code == 200 and r.headers["x-request-id"] == "same-id"
        out: dict[str, object] = r.json()["choices"][0]
        return out

    full = str(complete()["text"])
    stop = full[10:12]
    cut = complete(stop=[stop, "never-there"])
    assert cut["text"] == full[:full.index(stop)] and cut["finish_reason"] == "stop"
    streamed = httpx.post(stack.http + "/v1/completions",
                          json={"prompt": "abc", "max_tokens": 40, "stop": stop, "stream": True},
                          headers={"x-request-id": "same-id"}).text
    parts = [json.loads(e[6:]) for e in streamed.split("\n\n") if e and e != "data: [DONE]"]
    assert "".join(p["choices"][0]["text"] for p in parts) == full[:full.index(stop)]


def test_slo_headers_and_body_fields_reach_the_request_and_its_log_line(
        stack: Stack, tmp_path: Path) -> None:
    httpx.post(stack.http + "/v1/completions", json={"prompt": "a", "max_tokens": 2,
               "priority": 3, "tbt_slo_ms": 150}, headers={
               "x-request-id": "slo-1", "x-llm-d-slo-ttft-ms": "250"}).raise_for_status()
    log = next(tmp_path.glob("logs*")) / "gateway.log"
    deadline = time.monotonic() + 5
    line: dict[str, object] = {}
    while not line and time.monotonic() < deadline:
        for raw in log.read_text().splitlines():
            rec = json.loads(raw) if raw.startswith("{") else {}
            if rec.get("event") == "request" and rec.get("request_id") == "slo-1":
                line = rec
        time.sleep(0.05)
    assert line["ttft_slo_s"] == 0.25 and line["tbt_slo_s"] == 0.15 and line["priority"] == 3
    assert line["output_tokens"] == 2 and line["finish_reason"] == "length"
    assert line["instance"] and line["policy"] == "sarathi" and line["slo_met"] in (True, False)
    assert isinstance(line["ttft_s"], float) and isinstance(line["mean_tbt_s"], float)


def test_metrics_show_vllm_families_with_counts_after_requests(stack: Stack) -> None:
    for _ in range(3):
        _client(stack).completions.create(model=MODEL, prompt="hello", max_tokens=4)
    text = httpx.get(stack.http + "/metrics").text
    sched = next(n for n in stack.services if n.startswith("scheduler"))
    engine = sched.removeprefix("scheduler-")
    label = f'{{model_name="{MODEL}"}}'
    per_engine = f'{{engine="{engine}",model_name="{MODEL}"}}'
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values[f"vllm:time_to_first_token_seconds_count{per_engine}"] == 3
    assert values[f"vllm:e2e_request_latency_seconds_count{per_engine}"] == 3
    assert values[f"vllm:inter_token_latency_seconds_count{per_engine}"] == 9
    assert values[f"vllm:prompt_tokens_total{per_engine}"] == 15
    assert values[f"vllm:generation_tokens_total{per_engine}"] == 12
    assert values[f"vllm:request_queue_time_seconds_count{per_engine}"] == 3
    for family in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"):
        assert f"{family}{per_engine}" in values, family
    assert f"sloserve:gateway_requests_running{label}" in values
    assert sum(v for k, v in values.items()
               if k.startswith("sloserve:slo_requests_total") and 'slo_met="true"' in k) == 3
    # the scheduler's port: its own families only, never vLLM's (the API port has them)
    text = httpx.get(f"http://{stack.services[sched].metrics}/metrics").text
    for family in ("sloserve:policy_decision_seconds_count",
                   "sloserve:perf_model_relative_error_count"):
        assert f"{family}{label}" in text, family
    assert "\nvllm:" not in text
    # the executor its batches, the perf-model service its fits (the warmup sweep's, at least)
    ex = next(s for n, s in stack.services.items() if n.startswith("executor"))
    text = httpx.get(f"http://{ex.metrics}/metrics").text
    for family in ("vllm:iteration_tokens_total_count", "sloserve:batch_execution_seconds_count"):
        assert f"{family}{label}" in text and f"{family}{label} 0.0" not in text, family
    perf = stack.services["perfmodel"]
    deadline = time.monotonic() + 10
    while f"sloserve:perf_model_refits_total{label}" not in (
            text := httpx.get(f"http://{perf.metrics}/metrics").text):
        assert time.monotonic() < deadline, "no refit counted"
        time.sleep(0.2)
    assert f"sloserve:perf_model_fit_mape{label}" in text


def test_models_and_health(stack: Stack) -> None:
    models = _client(stack).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(stack.http + "/health").status_code == 200


def test_api_key_is_required_when_configured(start_stack: Callable[..., Stack],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOSERVE_API_KEYS", "k1,k2")
    s = start_stack(http_port=free_port(), time_scale=0.02)
    r = httpx.get(s.http + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    ok = openai.OpenAI(base_url=s.http + "/v1", api_key="k2", max_retries=0)
    assert ok.completions.create(model=MODEL, prompt="a", max_tokens=1).usage is not None


def test_sdk_chat_and_stop_over_grpc_and_info_names_what_sim_ignores(stack: Stack) -> None:
    client = Client(stack.gateway)
    chunks = list(client.generate(messages=[{"role": "user", "content": "Name a colour."}],
                                  max_tokens=5, request_id="chat-1"))
    assert len(chunks) == 5 and chunks[-1].finish_reason == "length"
    info = client.info()
    assert info["chat_template"] == "chatml"
    assert set(info["instances"][0]["ignored_sampling"]) == {"temperature", "top_p", "top_k",
                                                             "seed"}
    with pytest.raises(ValueError, match="n: only n=1"):
        list(client.generate("x", n=2))


def test_requests_dropped_under_overload_get_429(start_stack: Callable[..., Stack]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from sloserve.policies.ascendra import AscendraConfig

    s = start_stack(policy="ascendra", http_port=free_port(),
                    policy_config=AscendraConfig(drop_late=True))
    body = {"prompt": [65] * 2000, "max_tokens": 2, "ttft_slo_ms": 1}  # late once queued

    def post(_: int) -> httpx.Response:
        return httpx.post(s.http + "/v1/completions", json=body, timeout=60)

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(post, range(6)))
    statuses = [r.status_code for r in answers]
    assert 429 in statuses and set(statuses) <= {200, 429}, statuses
    err = next(r for r in answers if r.status_code == 429).json()["error"]
    assert err["type"] == "rate_limit_error" and err["code"] == "resource_exhausted"
    text = httpx.get(s.http + "/metrics").text
    assert f'sloserve:requests_dropped_total{{model_name="{MODEL}",reason=' in text


def test_admission_shedding_at_the_door_is_429_over_http(
        start_stack: Callable[..., Stack], tmp_path: Path) -> None:
    """The scheduler's admission control (``sloserve.admission``, ``up --admission``) refuses a
    request that cannot meet its TTFT SLO behind the queue: over HTTP that is OpenAI's
    429, its message the ``shed:`` reason, streamed or not."""
    from concurrent.futures import ThreadPoolExecutor

    from sloserve.admission import SHED_PREFIX, Admission

    s = start_stack(policy="sarathi", http_port=free_port(),
                    admission=Admission())  # no drop_late: only admission
    body = {"prompt": [65] * 2000, "max_tokens": 2, "ttft_slo_ms": 300}

    def post(k: int) -> httpx.Response:
        return httpx.post(s.http + "/v1/completions", json={**body, "stream": k % 2 == 1},
                          timeout=60)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(8)))
    statuses = [r.status_code for r in answers]
    assert 429 in statuses and 200 in statuses and set(statuses) <= {200, 429}, statuses
    for r in answers:
        if r.status_code == 429:
            err = r.json()["error"]
            assert err["type"] == "rate_limit_error" and SHED_PREFIX in err["message"], err
    text = httpx.get(s.http + "/metrics").text
    dropped = [ln for ln in text.splitlines() if ln.startswith("sloserve:requests_dropped_total")]
    # one series for every shed request, whatever TTFT each was predicted (no label per value)
    assert dropped == [f'sloserve:requests_dropped_total{{model_name="{MODEL}",reason="shed"}} '
                       f'{float(statuses.count(429))}'], dropped
    log = next(tmp_path.glob("logs*")) / "gateway.log"  # the whole reason is in the log line
    deadline = time.monotonic() + 5
    while True:
        lines = [json.loads(raw) for raw in log.read_text().splitlines() if raw.startswith("{")]
        why = [r.get("drop_reason", "") for r in lines
               if r.get("event") == "request" and r.get("finish_reason") == "dropped"]
        if len(why) == statuses.count(429) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(why) == statuses.count(429) and all(w.startswith(SHED_PREFIX) for w in why), why
    values = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in text.splitlines()
              if ln.startswith("sloserve:slo_requests_total")}
    assert sum(values.values()) == len(answers)  # attainment = met / all: drops count, unmet
    assert sum(v for k, v in values.items() if 'slo_met="false"' in k) >= statuses.count(429)


def test_no_scheduler_connected_is_503_until_it_is_back(stack: Stack) -> None:
    name = next(n for n in stack.services if n.startswith("scheduler"))
    stack.kill(name)
    deadline = time.monotonic() + 10
    while httpx.get(stack.http + "/health").status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = httpx.post(stack.http + "/v1/completions", json={"prompt": "a", "max_tokens": 1})
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable_error"
    stack.restart(name)
    deadline = time.monotonic() + 30
    while httpx.get(stack.http + "/health").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_grpc_request_id_from_metadata_is_used_and_echoed(stack: Stack) -> None:
    import grpc

    from sloserve.services.proto import gateway_grpc, gateway_pb2

    with grpc.insecure_channel(stack.gateway) as ch:
        call = gateway_grpc.GatewayStub(ch).Generate(
            gateway_pb2.GenerateRequest(prompt="hi", max_tokens=2),
            metadata=(("x-request-id", "from-metadata-1"),))
        chunks = list(call)
        assert dict(call.initial_metadata())["x-request-id"] == "from-metadata-1"
    assert [c.request_id for c in chunks] == ["from-metadata-1"] * 2


def test_closing_a_stream_early_frees_the_request(start_stack: Callable[..., Stack],
                                                  tmp_path: Path) -> None:
    stack = start_stack(http_port=free_port())  # real-time sim: 2000 tokens take ~25 s
    body = {"prompt": "a", "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", stack.http + "/v1/completions", json=body,
                      headers={"x-request-id": "gone-1"}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    log = next(tmp_path.glob("logs*")) / "gateway.log"
    deadline = time.monotonic() + 10
    ended: dict[str, object] = {}
    while not ended:
        assert time.monotonic() < deadline, "no log line for the abandoned request"
        for raw in log.read_text().splitlines():
            rec = json.loads(raw) if raw.startswith("{") else {}
            if rec.get("event") == "request" and rec.get("request_id") == "gone-1":
                ended = rec
        time.sleep(0.05)
    assert ended["finish_reason"] == "abort"
    out = ended["output_tokens"]
    assert isinstance(out, int) and out < 2000
    import grpc

    from sloserve.services.proto import scheduler_grpc, scheduler_pb2

    sched = next(s for n, s in stack.services.items() if n.startswith("scheduler"))
    with grpc.insecure_channel(sched.address) as ch:  # the scheduler freed it too
        stub = scheduler_grpc.SchedulerStub(ch)
        md = stack.internal_metadata
        while (st := stub.Status(scheduler_pb2.StatusRequest(), metadata=md)).num_running \
                + st.num_waiting:
            assert time.monotonic() < deadline, "still on the scheduler"
            time.sleep(0.05)
