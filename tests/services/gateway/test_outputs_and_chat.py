"""Stop strings held back and cut as vLLM does; chat messages rendered with the model's
template or the ChatML fallback; the sim honours stop ids."""

from __future__ import annotations

import pytest

from sloserve.services.executor.backends import SimBackend, pseudo_token
from sloserve.services.gateway.chat import CHATML, render
from sloserve.services.gateway.outputs import StopStrings
from sloserve.services.gateway.validate import InvalidInput
from sloserve.services.proto import common_pb2, executor_pb2


def _stream(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    s, out = StopStrings(stops), []
    for k, p in enumerate(pieces):
        text, hit = s.push(p, last=k == len(pieces) - 1)
        out.append(text)
        if hit:
            return out, True
    return out, False


def test_stop_string_across_pieces_is_never_shown_and_ends_the_output() -> None:
    out, hit = _stream(["END"], ["ab", "cE", "N", "Dxyz"])
    assert hit and "".join(out) == "abc"
    assert all("E" not in o for o in out)  # the held-back prefix of the stop never leaves


def test_no_stop_string_releases_everything_by_the_last_piece() -> None:
    out, hit = _stream(["ZZZ"], ["ab", "Z", "Zc", "d"])
    assert not hit and "".join(out) == "abZZcd"
    assert out[:2] == ["", "a"]  # the last len("ZZZ") - 1 characters wait


def test_earliest_of_several_stops_wins() -> None:
    out, hit = _stream(["yz", "b"], ["abcxyz"])
    assert hit and out == ["a"]


def test_chatml_fallback_and_model_template() -> None:
    msgs = [("system", "Be brief."), ("user", "Hi")]
    assert render(msgs) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    llama = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    assert render(msgs, llama, bos_token="<s>") == "<s>[system]Be brief.[user]Hi"
    assert render(msgs, CHATML) == render(msgs)


@pytest.mark.parametrize(("msgs", "template", "match"), [
    ([], "", "messages: must not be empty"),
    ([("wizard", "x")], "", r"messages\[0\].role"),
    ([("user", "x")], "{{ raise_exception('no system turn') }}", "no system turn"),
    ([("user", "x")], "{{ ''.__class__.__mro__ }}", "messages: the chat template failed"),
])
def test_bad_chats_name_the_field(msgs: list[tuple[str, str]], template: str,
                                  match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        render(msgs, template)


def test_sim_backend_stops_on_a_stop_id() -> None:
    sim = SimBackend("llama-3-8b", "a100", fixed_batch_time=0.01)
    stop = pseudo_token("r", 2)
    first = next(k for k in range(10) if pseudo_token("r", k) == stop)
    plan = executor_pb2.BatchPlan(added=[executor_pb2.NewSequence(
        request_id="r", prompt_token_ids=[1], max_tokens=10,
        sampling=common_pb2.Sampling(stop_token_ids=[stop]))])
    stopped_at = None
    for k in range(10):
        plan.items.add(request_id="r", num_tokens=1, context_len=k + 1, samples_token=True,
                       token_index=k)
        step = sim.execute(plan)
        del plan.items[:]
        del plan.added[:]
        if "r" in step.stopped:
            stopped_at = k
            break
    assert stopped_at == first
    assert list(sim.describe().ignored_sampling) == ["temperature", "top_p", "top_k", "seed"]
