"""Issue 35, item 2: the OpenAI surface vLLM users rely on, driven by the official ``openai``
client against ``sloserve up --backend vllm --model smollm2-135m --gpu cpu`` and compared,
request by request, with stock ``vllm serve`` on the same prepared model in the same session
(greedy or seeded, so the answers are deterministic; a few tokens each).

One stack and one stock server for the module, started side by side (each eager and
float32, so neither compiles and both compute the same numbers; both with vLLM's ``hermes``
tool parser, SmolLM2's ChatML ``<tool_call>`` format).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from sloserve.services.model_store import resolve
from sloserve.services.store import free_port

MODEL = "smollm2-135m"
START_S = 1500.0  # both start at once on a shared 2-core machine: minutes each
FRANCE = "The capital of France is"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
LOGPROB_TOL = 0.05  # both float32, same kernels; batches differ, so not bit for bit

pytestmark = pytest.mark.timeout(1800)  # the module's servers start in the first test


@dataclass
class Servers:
    ours: openai.OpenAI
    stock: openai.OpenAI
    ours_url: str
    stock_url: str


def _wait(proc: subprocess.Popen[bytes], log: Path, ready: Any, name: str, t0: float) -> None:
    while not ready():
        assert proc.poll() is None, f"{name} exited: {log.read_text()[-3000:]}"
        assert time.monotonic() - t0 < START_S, f"{name} not ready: {log.read_text()[-3000:]}"
        time.sleep(2)


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """``$SLOSERVE_SURFACE_URLS`` = ``OURS,STOCK`` (base URLs) reuses two running servers
    started as below (iterating on this module without two cold starts)."""
    if urls := os.environ.get("SLOSERVE_SURFACE_URLS"):
        ours_url, stock_url = urls.split(",")
        yield Servers(
            openai.OpenAI(base_url=ours_url + "/v1", api_key="x", max_retries=0),
            openai.OpenAI(base_url=stock_url + "/v1", api_key="x", max_retries=0),
            ours_url,
            stock_url,
        )
        return
    model_dir = resolve(MODEL)
    tmp = tmp_path_factory.mktemp("surface")
    sport, gport, hport = free_port("127.0.0.1"), free_port("127.0.0.1"), free_port("127.0.0.1")
    slog, ulog = tmp / "vllm.log", tmp / "up.log"
    with slog.open("w") as f:
        stock = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(model_dir),
                "--served-model-name",
                MODEL,
                "--dtype",
                "float32",
                "--enforce-eager",
                "--max-model-len",
                "2048",
                "--enable-auto-tool-choice",
                "--tool-call-parser",
                "hermes",
                "--host",
                "127.0.0.1",
                "--port",
                str(sport),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        )
    with ulog.open("w") as f:
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sloserve.services.cli",
                "up",
                "--backend",
                "vllm",
                "--model",
                MODEL,
                "--gpu",
                "cpu",
                "--enforce-eager",
                "--dtype",
                "float32",
                "--tool-call-parser",
                "hermes",
                "--port",
                str(gport),
                "--http-port",
                str(hport),
                "--log-dir",
                str(tmp / "logs"),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ours_url, stock_url = f"http://127.0.0.1:{hport}", f"http://127.0.0.1:{sport}"
    try:
        t0 = time.monotonic()
        _wait(stock, slog, lambda: _http_ok(stock_url + "/v1/models"), "vllm serve", t0)
        _wait(up, ulog, lambda: "gateway ready" in ulog.read_text(), "sloserve up", t0)
        yield Servers(
            openai.OpenAI(base_url=ours_url + "/v1", api_key="x", max_retries=0),
            openai.OpenAI(base_url=stock_url + "/v1", api_key="x", max_retries=0),
            ours_url,
            stock_url,
        )
    finally:
        _stop(up)
        _stop(stock)


def both(s: Servers, kind: str, **kw: Any) -> tuple[Any, Any]:
    """The same request to sloserve and to stock vLLM."""
    api = (lambda c: c.chat.completions) if kind == "chat" else (lambda c: c.completions)
    return (api(s.ours).create(model=MODEL, **kw), api(s.stock).create(model=MODEL, **kw))


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= LOGPROB_TOL for x, y in zip(a, b))


def test_greedy_completion_logprobs_match_stock_vllm(servers: Servers) -> None:
    ours, stock = both(
        servers, "completions", prompt=FRANCE, max_tokens=4, temperature=0, logprobs=2
    )
    a, b = ours.choices[0], stock.choices[0]
    assert a.text == b.text and a.text.startswith(" Paris")
    assert a.logprobs.tokens == b.logprobs.tokens
    assert a.logprobs.text_offset == b.logprobs.text_offset
    assert _close(a.logprobs.token_logprobs, b.logprobs.token_logprobs)
    assert [sorted(t) for t in a.logprobs.top_logprobs] == [
        sorted(t) for t in b.logprobs.top_logprobs
    ]
    assert a.finish_reason == b.finish_reason == "length"


def test_greedy_chat_logprobs_and_top_logprobs_match_stock_vllm(servers: Servers) -> None:
    ours, stock = both(
        servers, "chat", messages=ASK, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    a, b = ours.choices[0], stock.choices[0]
    assert a.message.content == b.message.content
    ca, cb = a.logprobs.content, b.logprobs.content
    assert [t.token for t in ca] == [t.token for t in cb]
    assert _close([t.logprob for t in ca], [t.logprob for t in cb])
    assert [[x.token for x in t.top_logprobs] for t in ca] == [
        [x.token for x in t.top_logprobs] for t in cb
    ]
    assert all(len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode()) for t in ca)


def test_n_choices_of_batched_prompts_seeded_match_stock_vllm(servers: Servers) -> None:
    prompts = [FRANCE, "My favourite colour is"]
    ours, stock = both(
        servers, "completions", prompt=prompts, n=2, seed=7, temperature=1.0, max_tokens=4
    )
    assert [c.index for c in ours.choices] == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in stock.choices}
    assert [c.text for c in ours.choices] == [by_index[k] for k in range(4)]
    assert ours.usage.completion_tokens == stock.usage.completion_tokens
    assert ours.usage.prompt_tokens == stock.usage.prompt_tokens
    chat_ours, chat_stock = both(
        servers, "chat", messages=ASK, n=3, seed=3, temperature=1.0, max_tokens=4
    )
    assert [c.message.content for c in chat_ours.choices] == [
        c.message.content for c in sorted(chat_stock.choices, key=lambda c: c.index)
    ]


def test_echo_prepends_the_prompt_as_stock_vllm(servers: Servers) -> None:
    ours, stock = both(
        servers, "completions", prompt=FRANCE, echo=True, max_tokens=3, temperature=0
    )
    assert ours.choices[0].text == stock.choices[0].text
    assert ours.choices[0].text.startswith(FRANCE + " Paris")


def test_penalties_and_min_p_change_greedy_text_as_in_stock_vllm(servers: Servers) -> None:
    prompt = "List the days of the week: Monday, Tuesday,"
    plain = (
        servers.ours.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        .choices[0]
        .text
    )
    for extra in (
        {"presence_penalty": 1.5, "frequency_penalty": 1.0},
        {"repetition_penalty": 1.5},
        {"min_p": 0.2},
    ):
        ours, stock = both(
            servers, "completions", prompt=prompt, max_tokens=12, temperature=0, extra_body=extra
        )
        assert ours.choices[0].text == stock.choices[0].text, extra
        if "min_p" not in extra:  # greedy ignores min_p; penalties change the argmax
            assert ours.choices[0].text != plain, extra


def test_min_tokens_holds_eos_back_and_eos_as_last_token_is_stop(servers: Servers) -> None:
    short = [{"role": "user", "content": "Say hello."}]
    _, free = both(servers, "chat", messages=short, temperature=0, max_tokens=60)
    n = free.usage.completion_tokens
    assert free.choices[0].finish_reason == "stop" and n < 60  # ended by EOS
    # EOS as the last allowed token: vLLM says stop, not length
    ours, stock = both(servers, "chat", messages=short, temperature=0, max_tokens=n)
    assert ours.choices[0].finish_reason == stock.choices[0].finish_reason == "stop"
    assert ours.choices[0].message.content == stock.choices[0].message.content
    ours, stock = both(servers, "chat", messages=short, temperature=0, max_tokens=n - 1)
    assert ours.choices[0].finish_reason == stock.choices[0].finish_reason == "length"
    ours, stock = both(
        servers,
        "chat",
        messages=short,
        temperature=0,
        max_tokens=n + 8,
        extra_body={"min_tokens": n + 4},
    )
    assert ours.usage.completion_tokens >= n + 4
    assert ours.choices[0].message.content == stock.choices[0].message.content


def test_json_schema_answer_parses_against_its_schema_as_stock_vllm(servers: Servers) -> None:
    ask = [{"role": "user", "content": "Make up a person with a name and an age."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    ours, stock = both(
        servers, "chat", messages=ask, temperature=0, max_tokens=60, response_format=fmt
    )
    text = ours.choices[0].message.content
    assert ours.choices[0].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), PERSON)
    assert text == stock.choices[0].message.content
    ours, stock = both(
        servers,
        "chat",
        messages=ask,
        temperature=0,
        max_tokens=60,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(ours.choices[0].message.content), dict)
    assert ours.choices[0].message.content == stock.choices[0].message.content


def test_tool_choices_none_auto_required_named_answer_as_stock_vllm(servers: Servers) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in (
        "none",
        "auto",
        "required",
        {"type": "function", "function": {"name": "get_weather"}},
    ):
        ours, stock = both(
            servers,
            "chat",
            messages=ask,
            temperature=0,
            max_tokens=80,
            tools=TOOLS,
            tool_choice=choice,
        )
        a, b = ours.choices[0], stock.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in a.message.tool_calls or ()]
        assert calls == [
            (c.function.name, c.function.arguments) for c in b.message.tool_calls or ()
        ], choice
        assert (a.message.content or "") == (b.message.content or ""), choice
        assert a.finish_reason == b.finish_reason, choice
        if choice != "none" and choice != "auto":  # forced: a call to the one tool
            assert calls and calls[0][0] == "get_weather"


def test_continue_final_message_continues_the_last_turn_as_stock_vllm(servers: Servers) -> None:
    msgs = [*ASK, {"role": "assistant", "content": "The capital of France is"}]
    ours, stock = both(
        servers,
        "chat",
        messages=msgs,
        temperature=0,
        max_tokens=4,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert ours.choices[0].message.content == stock.choices[0].message.content
    assert ours.choices[0].message.content.startswith(" Paris")


def test_continuous_usage_stats_put_usage_on_every_chunk(servers: Servers) -> None:
    def usages(client: openai.OpenAI) -> list[tuple[int, int]]:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            temperature=0,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
        return [
            (c.usage.prompt_tokens, c.usage.completion_tokens)
            for c in stream
            if c.choices and c.choices[0].delta.content
        ]

    ours = usages(servers.ours)
    assert ours == usages(servers.stock)
    assert [n for _, n in ours] == list(range(1, len(ours) + 1))


def test_tokenize_detokenize_and_version_answer_as_stock_vllm(servers: Servers) -> None:
    for body in ({"model": MODEL, "prompt": "Hello world"}, {"model": MODEL, "messages": ASK}):
        a = httpx.post(servers.ours_url + "/tokenize", json=body).json()
        b = httpx.post(servers.stock_url + "/tokenize", json=body).json()
        assert a["tokens"] == b["tokens"] and a["count"] == b["count"], body
    ids = {"model": MODEL, "tokens": b["tokens"]}
    assert (
        httpx.post(servers.ours_url + "/detokenize", json=ids).json()
        == httpx.post(servers.stock_url + "/detokenize", json=ids).json()
    )
    assert httpx.get(servers.ours_url + "/version").json()["version"]


def test_fields_not_served_are_400_naming_the_field(servers: Servers) -> None:
    for kind, extra, field in (
        ("completions", {"logit_bias": {"1": 5}}, "logit_bias"),
        ("completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
        ("completions", {"echo": True, "logprobs": 1}, "echo"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("chat", {"response_format": {"type": "yaml"}}, "response_format"),
    ):
        api = servers.ours.chat.completions if kind == "chat" else servers.ours.completions
        body: dict[str, Any] = {"messages": ASK} if kind == "chat" else {"prompt": FRANCE}
        with pytest.raises(openai.BadRequestError) as err:
            api.create(model=MODEL, max_tokens=2, extra_body=extra, **body)
        assert err.value.body["param"] == field, err.value.body  # type: ignore[index]


def test_auto_tool_choice_parses_a_hermes_call_with_vllms_parser() -> None:
    """SmolLM2-135M's greedy answer above calls no tool under ``auto``; the parser that
    ``auto`` runs (vLLM's, via ``VllmTools``) turns its format into OpenAI's tool calls."""
    from sloserve.services.gateway.openai_surface import VllmTools

    tools = VllmTools("hermes", (resolve(MODEL) / "tokenizer.json").read_text())
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "auto"}
    call, structured = tools.start(body)
    assert structured is None  # auto: unconstrained, as vLLM runs it
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert tools.parse(call, text) == (None, [("get_weather", '{"city": "Paris"}')])
    assert tools.parse(call, "It is sunny.") == ("It is sunny.", [])
