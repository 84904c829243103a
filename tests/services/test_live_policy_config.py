"""The live stack runs the knobs it is given: each scheduler reports its policy config."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict

import grpc

from sloserve.policies import get_spec
from sloserve.policies.ascendra import AscendraConfig
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
