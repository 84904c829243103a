"""Ascendra (Ikram et al., 2025): one policy, two instance roles, one config.

The ``lp`` role (§5: value-function order, piggybacked decodes, offloading)
is ``ascendra_lp.AscendraLPPolicy``; the ``hp`` role (§6: prefill-first FCFS,
elastic batch) is ``ascendra_hp.AscendraHPPolicy``; the controller that
routes between them is ``sloserve.controller``. Both read ``AscendraConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sloserve.defaults import TBT_SLO
from sloserve.policies.base import BudgetConfig, knob
from sloserve.policies.value_functions import VALUE_FUNCTIONS


@dataclass(frozen=True, slots=True)
class AscendraConfig(BudgetConfig):
    """Knobs of both roles; ``token_budget`` (N) and ``compute_budget`` (C) are the LP's
    Algorithm 1 budgets (the HP batches whole prompts FCFS, §6)."""

    token_budget: int | None = knob(
        None, "LP token budget N of Alg. 1: each admitted prefill must fit whole "
        "(default: --hp-worst-batch-tokens, the HP's worst batch)", min=1)
    compute_budget: float | None = knob(
        None, "LP compute budget C of Alg. 1, seconds of predicted batch time (default: the "
        "tightest TBT SLO among the batch's piggybacked decodes; none: N alone)", min=0.0)

    max_num_seqs: int = knob(
        256, "HP batch cap, only with --no-hp-elastic (the §8.5 ablation)", min=1)
    lp_max_num_seqs: int = knob(128, "LP batch size (§6.2: 128)", min=1)
    value_function: str = knob(
        "edf", "LP waiting-queue order (§5.2)", choices=tuple(VALUE_FUNCTIONS))
    offload_threshold: float = knob(
        1.0, "LP offloads a request projected to miss here when its TTFT slack <= this x "
        "(worst-case HP batch + its own prefill) (§5.3; 0: never)", min=0.0)
    hp_worst_batch_tokens: int = knob(
        2048, "tokens in the worst-case HP prefill batch (§5.3); also HP's prefill cap", min=1)
    drop_late: bool = knob(False, "drop waiting requests already past their TTFT SLO (§6.3)")
    hp_elastic: bool = knob(True, "HP elastic batch: admit while KV minus the expected decode "
                            "growth allows (§6.2); off: --max-num-seqs caps it")
    hp_decode_len_prior: float = knob(
        0.0, "HP's expected output length before any request finished there (§6.2)", min=0.0)
    hp_free_kv_fraction: float = knob(
        0.1, "HP keeps admitting prefills while this fraction of KV stays free: the decode "
        "reservation never exceeds it (§6.2, §8.5: 10%)", min=0.0, max=1.0)

    def resolved(self, *, tbt_slo: float | None = TBT_SLO,
                 slo_mix: str | None = None) -> AscendraConfig:
        """N defaults to the HP's worst batch, not Sarathi's TBT-derived chunk size."""
        if self.token_budget is not None:
            return self
        return replace(self, token_budget=self.hp_worst_batch_tokens)

    @property
    def budget(self) -> int:
        return self.token_budget if self.token_budget is not None else self.hp_worst_batch_tokens

    def for_role(self, role: str, *, num_hp: int) -> AscendraConfig:
        """With no HP instance an LP has nowhere to offload to: offloading is off."""
        if role == "lp" and num_hp == 0 and self.offload_threshold != 0.0:
            return replace(self, offload_threshold=0.0)
        return self
