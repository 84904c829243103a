"""The executor's copy of each sequence's KV block table, rebuilt from plan deltas.

Issue 14 (plans as deltas): the scheduler sends a request's whole table only when
this stream holds none for it (``PlanItem.block_table``) and afterwards only the
blocks appended since the previous plan (``PlanItem.new_blocks``,
``convert.TableDeltas`` on the other side). ``freed`` and ``preempted`` drop a
table, as the scheduler's ``TableDeltas`` does with the same plan; ``added`` is
always sent with its whole table. One per executor stream (``reset`` on a new one).
"""

from __future__ import annotations

from sloserve.services.proto import executor_pb2


class BlockTables:
    __slots__ = ("_tables",)

    def __init__(self) -> None:
        self._tables: dict[str, list[int]] = {}

    def reset(self) -> None:
        self._tables.clear()

    def apply(self, plan: executor_pb2.BatchPlan) -> dict[str, list[int]]:
        """Apply ``plan``'s frees, preemptions and table deltas; the tables of its items.

        An item with neither a whole table nor one held here is a protocol error
        (the scheduler believes this stream holds a table it does not)."""
        tables = self._tables
        for rid in plan.freed:
            tables.pop(rid, None)
        for rid in plan.preempted:
            tables.pop(rid, None)
        out: dict[str, list[int]] = {}
        for it in plan.items:
            rid = it.request_id
            if it.block_table:
                table = tables[rid] = list(it.block_table)
            else:
                held = tables.get(rid)
                if held is None:
                    raise ValueError(f"plan {plan.iteration}: item {rid} has no block_table and "
                                     "this executor holds none for it (new_blocks is a delta)")
                if it.new_blocks:
                    held.extend(it.new_blocks)
                table = held
            out[rid] = table
        return out

    def table(self, request_id: str) -> list[int] | None:
        """The table held for ``request_id`` (a copy), ``None`` when none is held."""
        held = self._tables.get(request_id)
        return list(held) if held is not None else None
