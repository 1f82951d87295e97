"""``backfill simulate``: the real projector driven through a simulated cluster over a trace."""
