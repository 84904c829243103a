"""The live stack runs the knobs it is given: each scheduler reports its policy config."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict

import grpc

from sloserve.admission import Admission
from sloserve.policies import get_spec
from sloserve.policies.ascendra import AscendraConfig
from sloserve.services import admission_flags
from sloserve.services.proto import scheduler_grpc, scheduler_pb2
from sloserve.services.stack import Stack


def test_non_default_knobs_arrive_at_every_scheduler(start_stack: Callable[..., Stack]) -> None:
    cfg = AscendraConfig(token_budget=256, lp_max_num_seqs=32, value_function="sjf",
                         drop_late=True, hp_elastic=False, hp_decode_len_prior=64.0,
                         offload_threshold=0.5)
    stack = start_stack(policy="ascendra", instances=2, hp_instances=1, policy_config=cfg)
    for iid, role in (("lp0", "lp"), ("hp1", "hp")):
        with grpc.insecure_channel(stack.services[f"scheduler-{iid}"].address) as ch:
            st = scheduler_grpc.SchedulerStub(ch).Status(scheduler_pb2.StatusRequest(),
                                                        metadata=stack.internal_metadata)
        assert (st.policy, st.role) == ("ascendra", role)
        want = get_spec("ascendra").make(role, cfg, num_hp=1).config
        assert json.loads(st.policy_config) == asdict(want)


def _admission(stack: Stack, iid: str) -> object:
    with grpc.insecure_channel(stack.services[f"scheduler-{iid}"].address) as ch:
        st = scheduler_grpc.SchedulerStub(ch).Status(scheduler_pb2.StatusRequest(),
                                                    metadata=stack.internal_metadata)
    return json.loads(st.admission)


def test_admission_limits_arrive_at_every_scheduler_and_compare_sim_reads_them(
    start_stack: Callable[..., Stack],
) -> None:
    limits = Admission(max_queued_requests=7, max_queued_tokens=9000, shed_late=False)
    stack = start_stack(policy="sarathi", instances=2, admission=limits)
    for iid in ("lp0", "lp1"):
        assert _admission(stack, iid) == asdict(limits)
    assert admission_flags.from_json(json.dumps(asdict(limits))) == limits
    off = start_stack(policy="sarathi", admission=None)
    assert _admission(off, "lp0") is None
    assert admission_flags.from_json("null") is None
    assert admission_flags.from_json("") == Admission()  # a scheduler that does not say


def test_up_flags_give_the_admission_limits() -> None:
    p = argparse.ArgumentParser()
    admission_flags.add_flags(p)
    args = p.parse_args(["--no-shed-late", "--max-queued-requests", "3"])
    limits = admission_flags.limits_from_args(args)
    assert limits == Admission(max_queued_requests=3, shed_late=False)
    assert admission_flags.limits_from_args(
        p.parse_args(admission_flags.to_argv(limits))) == limits
    assert admission_flags.limits_from_args(p.parse_args(["--no-admission"])) is None
