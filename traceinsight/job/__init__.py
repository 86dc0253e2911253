"""Many ranks, one result: a distributed job's traces analyzed rank by rank, then combined.

discover (which files, which rank each is) → :func:`~traceinsight.job.rank.analyze_rank` per rank,
in a local process pool or on a ``dask.distributed`` cluster (:mod:`.execute`), each mapping the
single-trace analysis over one trace and returning a small picklable
:class:`~traceinsight.results.job.RankResult`, never the events → :func:`.combine.combine`
(collectives matched across ranks, lateness, stragglers with their cause, findings common to ranks)
→ the job's :class:`~traceinsight.results.job.JobResult`. This layer computes and returns: it writes no
file and renders nothing.
"""

from __future__ import annotations

from traceinsight.job.combine import combine
from traceinsight.job.discover import RankFile, discover_ranks, is_job
from traceinsight.job.rank import RankReports, RankTask, analyze_rank

__all__ = ["RankFile", "RankReports", "RankTask", "analyze_rank", "combine", "discover_ranks", "is_job"]
