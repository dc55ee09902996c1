"""xdist's loadscope scheduling by case group, made safe against a worker that dies mid-case.

A scope is one (case, profile) group (harness/records/node_ids.py): xdist's own scope, everything
before the last ``::``, would be the whole case, every profile and sweep variant on one worker.

pytest-xdist 3.8's ``LoadScopeScheduling.remove_node`` puts a crashed worker's unfinished
case group back in the queue *including the item that crashed*, so a wrapper that kills its
process is run again on every replacement worker: the session loops until the restart limit
and then waits forever for work no worker will take. Here the crashed item is marked done
first; it is reported as crashed (by xdist) and only the rest of its group is rescheduled.
"""

from __future__ import annotations

from harness import compat
from harness.records import node_ids

# The members this subclass overrides or reads are checked present (harness/compat.py).
LoadScopeScheduling = compat.loadscope_scheduling()


class CrashSafeLoadScopeScheduling(LoadScopeScheduling):
    def _split_scope(self, nodeid):  # type: ignore[override]
        parts = node_ids.parse(nodeid)
        return parts.group if parts else super()._split_scope(nodeid)

    def remove_node(self, node):  # type: ignore[override]
        crashed = None
        for work_unit in self.assigned_work.get(node, {}).values():
            crashed = next((nodeid for nodeid, completed in work_unit.items() if not completed), None)
            if crashed is not None:
                work_unit[crashed] = True  # never hand the item that killed a worker out again
                break
        rescheduled_crash = super().remove_node(node)
        return crashed if crashed is not None else rescheduled_crash

    def _reschedule(self, node):  # type: ignore[override]
        """A worker runs an item only once it has the next one (or is told to shut down), so
        a replacement worker that receives a one-item group -- what is left of a crashed
        group -- would wait forever: keep topping it up, and shut it down when the queue is
        empty so it runs what it holds."""
        super()._reschedule(node)
        while not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
            self._assign_work_unit(node)
        if not node.shutting_down and not self.workqueue:
            node.shutdown()
