"""Ascendra (Ikram et al., 2025): LP and HP instance policies, registered on import.

``ascendra-lp`` (§5: value-function order, piggybacked decodes, offloading)
lives in ``ascendra_lp``; ``ascendra-hp`` (§6: prefill-first FCFS, elastic
batch) in ``ascendra_hp``; the controller that routes between them is
``sloserve.router``. Both drop late requests when ``drop_late`` (§6.3).
"""

from __future__ import annotations

from sloserve.policies.ascendra_hp import AscendraHPPolicy
from sloserve.policies.ascendra_lp import AscendraLPPolicy

__all__ = ["AscendraHPPolicy", "AscendraLPPolicy"]
