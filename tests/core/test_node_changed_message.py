"""The NodeChanged cancel says what happened to the Model's node (a new user's trial: "moved from
node ? to node1" when a Model's node first became known)."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from backfill.core.commands import Admit, Cancel

from .builders import Log

IDLE = 600.0


@pytest.mark.parametrize(
    "before, after, expected",
    [
        ("", "n1", "Model m's node became known (n1) after the Job was admitted without one"),
        ("n1", "n2", "Model m moved from node n1 to n2"),
        ("n1", "", "Model m's node is no longer known (it was n1)"),
    ],
)
def test_the_node_changed_message(before, after, expected):
    log = Log().ready(0, node=before).cronjob(0).apply(0)
    if before:
        admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    else:
        # Nothing is admitted on a Model with no node now (ModelNodeUnknown); an admission from
        # an older log, made before that gate, is followed all the same.
        assert not [c for c in log.decide(IDLE) if isinstance(c, Admit)]
        twin = Log().ready(0, node="elsewhere").cronjob(0).apply(0)
        admit = replace(next(c for c in twin.decide(IDLE) if isinstance(c, Admit)), node="")
    log.admit(admit, IDLE).job("JobCreated", admit.job_name, IDLE + 1)
    log.ready(IDLE + 2, node=after)
    (cancel,) = [c for c in log.decide(IDLE + 3) if isinstance(c, Cancel)]
    assert (cancel.reason, cancel.message) == ("NodeChanged", expected)
