"""Pipeline parallelism: schedules as data, a validator, a simulator, pictures, a runtime.

Example:
    >>> import pipeline
    >>> schedule = pipeline.schedules.one_f_one_b(4, 8)
    >>> schedule.validate()
    >>> pipeline.simulate(schedule, forward=1, backward=2).bubble_fraction  # 3/11
    0.2727272727272727
    >>> losses = pipeline.run(schedule, comm, [pipeline.Stage(fwd, bwd)], inputs=..., targets=..., loss_fn=...)
"""

from . import mlp, schedules
from ._action import Action, ActionKind, grid
from ._runtime import StageError, run
from ._schedule import Schedule
from ._simulate import Event, Simulation, from_trace, period, simulate
from ._stage import Stage
from ._tied import reduce_tied, tied_group

__all__ = [
    "Action",
    "ActionKind",
    "Event",
    "Schedule",
    "Simulation",
    "Stage",
    "StageError",
    "from_trace",
    "grid",
    "mlp",
    "period",
    "reduce_tied",
    "run",
    "schedules",
    "simulate",
    "tied_group",
]
