"""Typed policy configs and the registry: one declaration per policy, checked fields, roles."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from sloserve.defaults import default_token_budget
from sloserve.policies import get_spec, instance_roles, policy_names
from sloserve.policies.accelgen import AccelGenConfig
from sloserve.policies.ascendra import AscendraConfig
from sloserve.policies.ascendra_hp import AscendraHPPolicy
from sloserve.policies.ascendra_lp import AscendraLPPolicy
from sloserve.policies.base import knob_types
from sloserve.policies.sarathi import SarathiConfig, SarathiPolicy
from sloserve.policies.vllm import VllmConfig


def _bad_value(cls: type, name: str) -> object:
    f = next(f for f in fields(cls) if f.name == name)
    hint = knob_types(cls)[name]
    if hint is bool:
        return 1  # an int is not a bool
    if "choices" in f.metadata:
        return "bogus"
    if "min" in f.metadata:
        return f.metadata["min"] - 1
    return "not a number"


def test_the_policy_list_is_the_registry() -> None:
    assert policy_names() == ["vllm", "sarathi", "ascendra", "accelgen", "orca", "oracle", "slack"]


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "ascendra", "accelgen", "orca", "oracle",
                                    "slack"])
def test_every_field_rejects_a_bad_value_naming_the_field(policy: str) -> None:
    cls = get_spec(policy).config_cls
    for f in fields(cls):
        with pytest.raises(ValueError, match=rf"^{f.name}: "):
            cls(**{f.name: _bad_value(cls, f.name)})


def test_value_function_error_lists_the_choices() -> None:
    with pytest.raises(ValueError) as err:
        AscendraConfig(value_function="edff")
    assert str(err.value) == (
        "value_function: must be one of edf, priority, sjf, ljf, fcfs; got 'edff'")


def test_cross_field_rule_names_the_field() -> None:
    with pytest.raises(ValueError, match="^min_token_budget: must be <= max_token_budget"):
        AccelGenConfig(min_token_budget=100, max_token_budget=50)
    with pytest.raises(ValueError, match="^jct_preempt_prob: must be <= 1"):
        AccelGenConfig(jct_preempt_prob=1.5)


def test_no_string_keyed_knobs_remain() -> None:
    for name in policy_names():
        assert "extra" not in {f.name for f in fields(get_spec(name).config_cls)}


def test_every_knob_is_documented() -> None:
    for name in policy_names():
        for f in fields(get_spec(name).config_cls):
            assert f.metadata.get("help"), (name, f.name)


def test_unset_token_budget_follows_the_sarathi_slo_rule() -> None:
    assert SarathiConfig().resolved(tbt_slo=0.15).token_budget == 512
    assert SarathiConfig().resolved(tbt_slo=0.5).token_budget == 2048
    assert SarathiConfig().resolved(tbt_slo=0.5, slo_mix="hetero").token_budget == 512
    assert SarathiConfig(token_budget=100).resolved(tbt_slo=0.5).token_budget == 100
    assert default_token_budget(None, None) == 512
    assert VllmConfig().resolved(tbt_slo=0.5) == VllmConfig()  # no budget to resolve


def test_unknown_policy_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"^policy: unknown 'x'; choose one of \['vllm'"):
        get_spec("x")


def test_spec_makes_each_role_and_applies_ascendra_role_rules() -> None:
    spec = get_spec("ascendra")
    cfg = AscendraConfig(offload_threshold=2.0, lp_max_num_seqs=64)
    lp, hp = spec.make("lp", cfg, num_hp=1), spec.make("hp", cfg, num_hp=1)
    assert isinstance(lp, AscendraLPPolicy) and isinstance(hp, AscendraHPPolicy)
    assert lp.config == replace(cfg, token_budget=2048)  # N = hp_worst_batch_tokens (Alg. 1)
    assert spec.make("lp", cfg, num_hp=0).config.offload_threshold == 0.0  # nowhere to offload
    assert spec.make("hp", cfg, num_hp=0).config.offload_threshold == 2.0
    assert isinstance(get_spec("sarathi").make("lp"), SarathiPolicy)
    with pytest.raises(ValueError, match="^role: policy 'sarathi' has no 'hp' role"):
        get_spec("sarathi").make("hp")
    with pytest.raises(ValueError, match="^config: policy 'sarathi' takes a SarathiConfig"):
        get_spec("sarathi").make("lp", VllmConfig())


def test_instance_roles_puts_lp_first_and_numbers_them_overall() -> None:
    assert instance_roles("ascendra", 3, 1) == [("lp0", "lp"), ("lp1", "lp"), ("hp2", "hp")]
    assert instance_roles("vllm", 2, 0) == [("lp0", "lp"), ("lp1", "lp")]
    with pytest.raises(ValueError, match="^hp_instances: policy 'sarathi' has no HP"):
        instance_roles("sarathi", 3, 1)
    with pytest.raises(ValueError, match=r"^hp_instances: must be in \[0, instances\)"):
        instance_roles("ascendra", 2, 2)
    with pytest.raises(ValueError, match="^instances: must be >= 1"):
        instance_roles("ascendra", 0, 0)


def test_default_hp_is_a_third_for_a_policy_with_an_hp_role() -> None:
    assert [get_spec("ascendra").default_hp(n) for n in (1, 2, 3, 6)] == [0, 1, 1, 2]
    assert get_spec("sarathi").default_hp(6) == 0


def test_a_float_knob_takes_an_int_as_a_float_and_rejects_nan() -> None:
    assert repr(AscendraConfig(offload_threshold=2).offload_threshold) == "2.0"
    with pytest.raises(ValueError, match="^gamma: must be finite"):
        AccelGenConfig(gamma=float("nan"))
