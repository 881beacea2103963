"""Pipeline parallelism: schedules as data, a validator, a simulator, pictures, a runtime.

Example:
    >>> import pipeline
    >>> schedule = pipeline.schedules.one_f_one_b(4, 8).validate()   # raises unless it can run
    >>> pipeline.simulate(schedule, forward=1, backward=2).bubble_fraction  # 3/11
    0.2727272727272727
    >>> stage = pipeline.Stage(lambda x, mb: 2 * x, lambda dy, mb: 2 * dy)   # this rank's chunk
    >>> mse = lambda y, t: (float(((y - t) ** 2).mean()), 2 * (y - t) / y.size)
    >>> pipeline.run(pipeline.schedules.one_f_one_b(comm.size, 2), comm, [stage],
    ...              inputs=[x, x], targets=[2 * x, x], loss_fn=mse)   # at one rank: every stage
    [0.0, 3.5]
"""

from collectives import __version__ as __version__

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
