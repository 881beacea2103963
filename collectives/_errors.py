"""The error classes of the collectives layer.

One class per event: the first call that fails on each rank raises the class of the event
that ended it, whichever rank saw the event first. A rank that declares a communicator failed
tells the others (a failure notice, :mod:`collectives._safety.guard`), and the notice carries the class of its
error; a rank told raises that class, naming the rank that declared it and its error. Only a
later call on the dead communicator is a different event: ``CommunicatorStateError``.

=============================================  ===========================================
event                                          first failing call, on every rank
=============================================  ===========================================
a call did not complete within the timeout     ``CollectiveTimeoutError``
ranks called different collectives             ``CollectiveMismatchError`` (every rank
                                               finds it itself; the communicator lives on)
an MPI, NCCL or CUDA error                     ``CollectivesError`` itself
a rank left the program, holding it open       ``CommunicatorStateError``
any later call on the dead communicator        ``CommunicatorStateError``
=============================================  ===========================================

Example (at one rank: a recv that no send matches, then a later call):
    >>> comm = col.init(timeout=0.2)
    >>> try:
    ...     with comm.group():
    ...         y = comm.recv(np.empty(3, np.float32), 0)
    ... except CollectiveTimeoutError as e:
    ...     print(e)
    recv #1 (shape (3,), float32) on rank 0 did not complete after 0.2 s (timeout 0.2 s); ...
    >>> comm.all_reduce(x)
    Traceback (most recent call last):
    collectives._errors.CommunicatorStateError: all_reduce: communicator is unusable after an earlier error: recv #1 ...
    >>> comm.close()

On several ranks, a rank told of another's timeout raises the same class, naming that rank:
``all_reduce: communicator is unusable: rank 3 (world rank 3) declared it failed:
all_reduce #2 (shape (3,), float32) on rank 3 did not complete after 3.0 s ...``.
"""

from __future__ import annotations


class CollectivesError(RuntimeError):
    """Base class of every error raised by this library; raised itself for an MPI, NCCL or
    CUDA error (on the rank that met it, and on the others, told of it)."""


class InvalidArgumentError(CollectivesError, ValueError):
    """Bad input found locally, before any communication.

    Example: ``comm.broadcast(x, root=7)`` on 4 ranks raises
    ``InvalidArgumentError("broadcast: root must be in [0, 4), got 7")``.
    """


class CommunicatorStateError(CollectivesError):
    """The communicator cannot take the call: closed, aborted, failed earlier (the message
    names the first failure), left by another rank (which told this one as it exited), or in
    use by another thread. Not a ``ValueError``: the arguments may be fine.

    A call that fails because another rank timed out or met an MPI error is not one: it
    raises that rank's class (:mod:`._errors`); a later call on the dead communicator is.

    Example: ``comm.close(); comm.barrier()`` raises
    ``CommunicatorStateError("barrier: communicator is closed (rank 0)")``.
    """


class CollectiveMismatchError(CollectivesError):
    """Ranks called different collectives (op, shape, dtype, root or reduce op differ);
    raised on every rank, each finding it in the comparison all ranks make."""


class CollectiveTimeoutError(CollectivesError, TimeoutError):
    """A collective did not complete within the communicator's timeout; the communicator is
    dead. Raised by the rank that timed out, and by every other rank whose call fails because
    that rank declared it (told before its own timeout): its message then names that rank
    and its call."""


class BackendUnavailableError(CollectivesError):
    """The requested backend cannot run here (no GPU, no NCCL, CuPy missing...)."""


#: The classes a failure notice carries, by name: the public ones (a subclass travels as the
#: nearest of them in its method resolution order).
_EVENT_CLASSES: dict[str, type[CollectivesError]] = {
    c.__name__: c
    for c in (
        CollectiveTimeoutError,
        CollectiveMismatchError,
        CommunicatorStateError,
        InvalidArgumentError,
        BackendUnavailableError,
        CollectivesError,
    )
}


def event_name(error: BaseException) -> str:
    """The name of ``error``'s class as a failure notice carries it.

    Example:
        >>> event_name(CollectiveTimeoutError("...")), event_name(KeyError(1))
        ('CollectiveTimeoutError', 'CommunicatorStateError')
    """
    for c in type(error).__mro__:
        if c.__name__ in _EVENT_CLASSES and _EVENT_CLASSES[c.__name__] is c:
            return c.__name__
    return CommunicatorStateError.__name__


def event_class(name: str) -> type[CollectivesError]:
    """The class a failure notice names (``CommunicatorStateError`` for a name not known).

    Example:
        >>> event_class("CollectiveTimeoutError") is CollectiveTimeoutError
        True
    """
    return _EVENT_CLASSES.get(name, CommunicatorStateError)


def told_error(call: str, notice: tuple[type[CollectivesError], str]) -> CollectivesError:
    """The error a rank raises at ``call`` when another rank's failure notice (its class and
    text) told it that the communicator failed.

    Example:
        >>> told_error("all_reduce", (CollectiveTimeoutError, "rank 3 declared it failed"))
        CollectiveTimeoutError('all_reduce: communicator is unusable: rank 3 declared it failed')
    """
    kind, text = notice
    return kind(f"{call}: communicator is unusable: {text}")


# Errors are raised as their classes, the call's name first:
# ``raise InvalidArgumentError(f"send: peer must be ...")``.
