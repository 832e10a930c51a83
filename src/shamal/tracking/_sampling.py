"""Which points of a metric's history a sampled read keeps: pure, no database.

A stock MLflow server (the version Shamal speaks) samples ``get-history-bulk-interval`` by
row, run by run: the run's points in (step, timestamp, value, is-NaN) order are cut into
``max_results`` buckets as SQL's ``NTILE`` cuts them (the first ``total % max_results``
buckets one point longer), the first point of each bucket is kept, and the last point of
all replaces the last one kept when it is not already there, so the curve keeps both ends
and never exceeds ``max_results`` points.
"""

from __future__ import annotations

#: ``max_results`` of a sampled history: its default and cap, per run, as on a stock server.
MAX_SAMPLED_POINTS = 2500


def sampled_positions(total: int, max_results: int) -> list[int]:
    """The positions (0-based, ascending) of the points kept out of ``total`` in order.

    Every point when there are no more than ``max_results``; else the first point of each
    ``NTILE(max_results)`` bucket, with the last position in place of the last bucket's
    first when they differ.
    """
    if total <= 0:
        return []
    if total <= max_results:
        return list(range(total))
    size, longer = divmod(total, max_results)
    # Bucket b starts after b buckets of `size` points and min(b, longer) extra ones.
    kept = [b * size + min(b, longer) for b in range(max_results)]
    kept[-1] = total - 1
    return kept
