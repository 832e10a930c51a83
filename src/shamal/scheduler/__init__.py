"""The scheduler, whole: a pure core and the live scheduler built on it.

* :mod:`shamal.scheduler.core`: policies, admission, placement, the runtime predictor and
  the trace simulator, over a resource model. Pure: no database, no executors, no clock of
  its own; the simulator and the live scheduler share it.
* :mod:`shamal.scheduler.live`: the loop that runs jobs on a real cluster: its lifecycle
  and leases in the database, the cluster model and fitting, and the server's scheduler
  thread. It reads and moves the jobs that :mod:`shamal.jobs` takes from people and starts
  them through :mod:`shamal.executors`.

Import one of the two; this package itself exports nothing, so the simulator loads without
the live part.
"""

__all__: list[str] = []
