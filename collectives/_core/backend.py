"""The interface every backend implements, and what the NCCL backend is bootstrapped with.

The front end (:class:`~collectives.Communicator`) checks arguments and keeps the books; a
backend only moves data. Each verb takes what it needs of ``x`` the input (None where a
rank sends nothing), ``out`` where the result goes (None where a rank receives nothing),
``name`` the dtype's name, ``op`` a :class:`ReduceOp`, ``root`` a rank and ``peer`` the other
rank, as cupyx's do. A verb returns a :class:`Pending`. A backend that fails for good
(a timeout, an NCCL error) keeps the error in ``failure`` and raises it; the front end
then declares the communicator dead.

A backend is built before its front end; the front end then hands it a
:class:`BackendContext` (:meth:`Backend.attach`): the timeout, the flight recorder, and
callbacks for waiting and for failure. A backend reaches the front end through that alone.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Protocol, TypeVar

from mpi4py import MPI

from .._errors import CollectivesError, CollectiveTimeoutError
from .._ops import ReduceOp
from .work import Pending, timeout_error

if TYPE_CHECKING:
    from .books import CallBooks

T = TypeVar("T")

#: A backend verb bound to all of its arguments but its arrays: ``verb(x, out) -> Pending``
#: (what the front end runs, and the MPI backend's stager runs on host copies).
Verb = Callable[[Any, Any], Pending]


class Waiter(Protocol):
    """What a pending's waits (``Pending.wait(waiter)``, ``Pending.synchronize(waiter)``) read
    of the front end: the polling and timeout rules, and what a timeout error names."""

    @property
    def rank(self) -> int: ...
    @property
    def timeout(self) -> float: ...
    @property
    def yield_after(self) -> float: ...
    @property
    def recorder(self) -> Any: ...
    def mpi_comm_world_ranks(self) -> list[int]: ...
    def progress_report(self) -> str: ...
    def check_peers(self, call: str) -> None: ...
    def post_waiting(self, pending: Pending) -> Any: ...
    def peer_failure(self) -> tuple[type[CollectivesError], str] | None: ...
    def declare_blocked(self, error: CollectivesError, told: str | None = None) -> None: ...


class BackendContext:
    """What the front end gives its backend (:meth:`Backend.attach`), in place of itself.

    Attributes:
        waiter: what the backend passes to its pendings' waits (the front end's rules).
        books: the front end's books (:mod:`collectives._core.books`): ``seq()`` and ``current()`` read them,
            ``inside(code)`` posts a blocking call on the progress board.
        fail: ``fail(error)``: the backend raised ``error``, which ends the communicator where
            it is a timeout or the backend's ``failure`` (the front end then declares it dead).
        mpi_error: ``mpi_error(call, error)`` raises an ``MPI.Exception`` as the front end's
            ``CollectivesError``, the communicator dead.
        dump_flight_record: ``dump_flight_record()`` writes the flight record where the user
            asked (``COLLECTIVES_FLIGHT_RECORDER``), before a backend ends the job.

    Example:
        >>> from collectives._mpi.backend import MpiBackend
        >>> backend = MpiBackend(comm.mpi_comm)
        >>> life = comm._life                # the communicator's Lifecycle
        >>> context = BackendContext(comm, comm._books, life.fatal, life.mpi_error,
        ...                          life.dump_flight_record)   # as the Communicator does
        >>> backend.attach(context)
        >>> pending = backend.all_reduce(x, x, "float32", ReduceOp.SUM)
        >>> context.wait(pending)            # pending.wait under the communicator's rules
        >>> pending.done
        True
    """

    # __weakref__: the watchdog of blocking calls holds contexts weakly
    __slots__ = ("waiter", "books", "fail", "mpi_error", "dump_flight_record", "__weakref__")

    def __init__(
        self,
        waiter: Waiter,
        books: CallBooks,
        fail: Callable[[CollectivesError], None],
        mpi_error: Callable[[str, Any], NoReturn],
        dump_flight_record: Callable[[], None],
    ):
        self.waiter = waiter
        self.books = books
        self.fail = fail
        self.mpi_error = mpi_error
        self.dump_flight_record = dump_flight_record

    @property
    def timeout(self) -> float:
        return self.waiter.timeout

    def seq(self) -> int:
        """How many calls the front end has numbered (the current call's number while it is
        issued)."""
        return self.books.seq

    def current(self) -> tuple:
        """``(seq, call, shape, dtype, start)`` of the call being issued (or issued last)."""
        return self.books.current

    def inside(self, code: int) -> None:
        """Post on the progress board that this rank is inside the blocking MPI call ``code``
        (``_safety.progress.BLOCKING_CALLS``) of its current collective; 0: it has returned."""
        self.books.inside(code)

    @property
    def recorder(self) -> Any:
        """The flight recorder (a deque of the last calls)."""
        return self.waiter.recorder

    def wait(self, pending: Pending) -> None:
        """``pending.wait`` under the front end's rules (it raises; it declares nothing)."""
        pending.wait(self.waiter)

    def complete(self, pending: Pending, block: bool = True) -> None:
        """``pending.synchronize`` (``block``) or ``pending.wait`` under the front end's rules;
        an error ends the communicator where it must (:attr:`fail`), and an MPI error is
        raised as the front end's (:attr:`mpi_error`). Every wait that may fail goes here."""
        try:
            if block:
                pending.synchronize(self.waiter)
            else:
                pending.wait(self.waiter)
        except CollectivesError as e:
            self.fail(e)
            raise
        except MPI.Exception as e:
            self.mpi_error(pending.call, e)

    def synchronize(self, pending: Pending) -> None:
        """``pending.synchronize`` under the front end's rules (raises; declares nothing)."""
        pending.synchronize(self.waiter)

    def timeout_error(self, pending: Pending, waited: float) -> CollectiveTimeoutError:
        """The error that says ``pending`` timed out after ``waited`` seconds."""
        return timeout_error(self.waiter, pending, waited)

    def peer_failure(self) -> tuple[type[CollectivesError], str] | None:
        """The class and text of another rank's failure notice, or None while none arrived
        (asked from the watchdog's thread, under ``MPI_THREAD_MULTIPLE``)."""
        return self.waiter.peer_failure()

    def declare_blocked(self, error: CollectivesError, told: str | None = None) -> None:
        """Declare the communicator failed with ``error`` while this rank is stuck in a
        blocking MPI call (the watchdog's thread): the other ranks told (or ``told``, the
        notice that told this one, passed on), ``error`` naming the missing ranks."""
        self.waiter.declare_blocked(error, told)


class Backend(Protocol):
    """What :class:`~collectives.Communicator` calls. ``MpiBackend`` and ``NcclBackend``
    implement it (checked by mypy where ``_init`` builds them).

    Example:
        >>> from collectives._mpi.backend import MpiBackend
        >>> impl: Backend = MpiBackend(comm.mpi_comm)
        >>> impl.attach(comm._context)                   # the front end's, before any call
        >>> pending = impl.all_reduce(x, x, "float32", ReduceOp.SUM)   # x in, x out
        >>> pending.wait(comm)                           # under the communicator's rules
        >>> pending.done, x
        (True, array([0., 1., 2., 3.], dtype=float32))
    """

    name: str

    @property
    def failure(self) -> CollectivesError | None:
        """The error that ended this backend for good, or None."""
        ...

    @property
    def unfinished(self) -> bool:
        """Calls were left in flight at a close or abort: the MPI communicator must not be
        freed under them."""
        ...

    @property
    def xp(self) -> Any:
        """The array module of the arrays this backend's calls take (numpy, cupy)."""
        ...

    #: whether :meth:`check_arrays` checks anything (the front end skips it otherwise)
    checks_arrays: bool

    @property
    def call_form(self) -> str:
        """Which calls the backend makes, in a few words (``comm.call_path``)."""
        ...

    def attach(self, context: BackendContext) -> None:
        """Take the front end's context; before the first call."""
        ...

    def check_arrays(self, call: str, x: Any, out: Any) -> None:
        """Raise ``InvalidArgumentError`` for arrays this backend cannot take."""
        ...

    @property
    def stager(self) -> Stager | None:
        """What stages device arrays through the host for this backend, or None."""
        ...

    def drain(self) -> None:
        """Finish the calls in flight before a close (under the timeout)."""
        ...

    # Each verb takes what it needs: ``x`` what is sent, ``out`` what is received into (the
    # same array for an in-place call; None where a rank receives nothing), ``name`` the
    # dtype's name, ``op`` a ReduceOp, ``root`` a rank, ``peer`` the other rank (a sendrecv's
    # destination; ``source`` the rank it receives from).
    def all_reduce(self, x: Any, out: Any, name: str, op: ReduceOp) -> Pending: ...
    def reduce(self, x: Any, out: Any, name: str, op: ReduceOp, root: int) -> Pending: ...
    def broadcast(self, x: Any, name: str, root: int) -> Pending: ...
    def all_gather(self, x: Any, out: Any, name: str) -> Pending: ...
    def reduce_scatter(self, x: Any, out: Any, name: str, op: ReduceOp) -> Pending: ...
    def all_to_all(self, x: Any, out: Any, name: str) -> Pending: ...
    def gather(self, x: Any, out: Any, name: str, root: int) -> Pending: ...
    def scatter(self, x: Any, out: Any, name: str, root: int) -> Pending: ...
    def send(self, x: Any, name: str, peer: int) -> Pending: ...
    def recv(self, out: Any, name: str, peer: int) -> Pending: ...
    def sendrecv(self, x: Any, out: Any, name: str, peer: int, source: int) -> Pending: ...
    def barrier(self) -> Pending: ...
    def group_start(self) -> None: ...
    def group_end(self, pendings: list) -> None: ...
    def split(
        self, child: Any, color: int | None, key: int
    ) -> tuple[Backend | None, dict[str, Any]]: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


class Stager(Protocol):
    """Runs a verb, on host copies where its arrays are on a device (the MPI backend's,
    where not CUDA-aware): the front end hands it every call whose arrays are not all
    NumPy arrays (or None)."""

    def run(self, verb: Verb, x: Any, out: Any) -> Pending: ...


#: The verbs (the methods that give a Pending), in the order above: what both backends have.
VERBS = tuple(
    name
    for name, member in vars(Backend).items()
    if inspect.isfunction(member) and inspect.signature(member).return_annotation == "Pending"
)


class Bootstrap(Protocol):
    """The host-side exchange a backend needs to create its communicators (MPI here: see
    :class:`collectives._bootstrap.MpiBootstrap`); the NCCL backend is handed one and
    starts none itself.

    Example:
        >>> from collectives._bootstrap import MpiBootstrap
        >>> bootstrap: Bootstrap = MpiBootstrap(comm.mpi_comm)
        >>> uid = bootstrap.share(lambda: b"id")   # nccl.get_unique_id: rank 0's id, on every rank
        >>> uid
        b'id'
    """

    rank: int
    size: int

    def share(self, make: Callable[[], T]) -> T:
        """``make()`` run on rank 0, its result (or its failure) on every rank."""
        ...

    def allgather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order."""
        ...

    def child(self, comm: Any) -> Bootstrap | None:
        """The bootstrap over a sub-communicator the front end made (None: not a member)."""
        ...
