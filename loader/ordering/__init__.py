"""Which rows form which batch: the epoch plan (`plan.py`) and its orders (`order.py`), the same on every
machine, the resume state (`state.py`) and where a loader stands in its epochs (`resume.py`)."""
