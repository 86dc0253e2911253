"""Many ranks, one report: a distributed job's traces analyzed rank by rank, then combined.

discover (which files, which rank each is) → :func:`~traceinsight.job.rank.analyze_rank` per rank,
in a local process pool or on a ``dask.distributed`` cluster (:mod:`.execute`), each returning a
small picklable :class:`~traceinsight.job.rank.RankResult`, never the events → :func:`.combine.combine`
(collectives matched across ranks, lateness, stragglers with their cause, findings common to ranks).
"""

from __future__ import annotations

from traceinsight.job.combine import JobReport, combine
from traceinsight.job.discover import RankFile, discover_ranks
from traceinsight.job.rank import RankResult, RankTask, analyze_rank

__all__ = ["JobReport", "RankFile", "RankResult", "RankTask", "analyze_rank", "combine", "discover_ranks"]
