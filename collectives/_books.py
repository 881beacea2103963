"""The books a communicator keeps on its calls: one object that every call path reads and writes.

Each call, whichever path runs it, does the same in this order:

1. take the thread token (one thread at a time per communicator; a second one is refused);
2. :meth:`CallBooks.number` it: ``seq`` counts every call; a collective also gets its number
   among collectives, ``seq - p2p``, written to this rank's progress-board ``slots[slot]`` and,
   when due (:mod:`._guard`), verified by ``checker``;
3. append a flight-recorder entry to ``recorder``;
4. post the call and wait for it (past ``yield_after`` of polling, under the timeout);
5. stamp the entry's end and give the token back.

The books are written once, in C (``_callbooks.c``, always built: this module documents
them and hands them their Python parts). Two paths use them: the general one
(``Communicator._run``, every call: ``take``, :meth:`CallBooks.number`, a backend's
``Pending`` as the entry, ``give``) and the direct path (:mod:`._direct`, the calls of NumPy
arrays on the MPI backend that need least), whose verbs (``CallBooks.all_reduce``, ...)
check a call and do steps 1 to 5 in C: ``begin`` numbers it and appends an :class:`Entry`,
and its MPI call is posted and polled by stateless primitives (``_fastmpi.c`` where it built,
mpi4py otherwise) that are handed buffers and handles and read no Python object.

An :class:`Entry` has named fields ``seq, call, shape, dtype, start, end`` (``end`` 0.0 until
it completes): a ``Pending`` is made from it only when someone reads the recorder
(:func:`collectives._work.recorded`), or when the call outlasts ``yield_after`` (its own
poll's, or the poll of its ``Work``: made with ``async_op=True``, or inside ``comm.group()``,
it gives a C ``Work`` that polls it when waited on, ``_callbooks_work.c``). When posting fails
nothing is in flight and the entry is removed; when polling fails (``MPI_Test`` returns
an error) the call was posted, so its entry stays, never completed, and the MPI error is
raised. Every wait, the direct path's included, is judged by :func:`._deadline.overdue`.

Example:
    >>> books = comm._books
    >>> comm.all_reduce(np.ones(2)); books.seq     # one more call
    1
"""

from __future__ import annotations

from mpi4py import MPI

from . import _callbooks
from ._callbooks import CallBooks, Entry
from ._check import POINT_TO_POINT
from ._errors import CommunicatorStateError

IN_USE = (
    "the communicator is in use by another thread; issue collectives on one "
    "communicator from one thread at a time"
)

_callbooks.configure(POINT_TO_POINT, CommunicatorStateError, IN_USE, MPI.Exception)

# Entry: one direct-path call in the flight recorder, named fields ``seq, call, shape, dtype,
# start, end`` (``end`` 0.0 until it completes; the only one that may be set).
#
# CallBooks: the per-call state of one communicator.
#
# ``CallBooks(slots, slot, recorder_length, yield_after, wait_long, rank, size, inside)``
#
# Attributes:
#     busy: whether a call holds the communicator (the thread token: ``take(call)`` takes it
#         or raises ``CommunicatorStateError`` naming ``call``; ``give()`` gives it back).
#     seq: calls made so far; ``p2p``: how many of them were point-to-point. Collectives are
#         numbered apart (``seq - p2p``) because ranks that pair up for send/recv make
#         different numbers of them.
#     slots, slot: the progress board's words (int64) and this rank's index there, held
#         until ``forget_board()``.
#     inside: the board's ``inside`` words (same index): a blocking direct-path call posts
#         there that this rank is inside it (``nth * 16 + code``), and 0 once it returns.
#     checker: the ``Guard`` (:mod:`._guard`), or None; called for a collective when
#         ``next_check`` (a collective number) is due, or when more than ``quiet`` seconds
#         passed since ``last_call`` (the monotonic time of the last collective).
#     recorder: the flight recorder, the last calls (entries or pendings).
#     yield_after: seconds of polling before a waiting rank yields its core.
#     wait_long: ``wait_long(request, entry, arrays)`` waits for a direct-path call that
#         outlasted ``yield_after``, under the timeout (set by the backend).
#     pending: ``pending(request, entry, arrays)``: the backend's ``Pending`` of a
#         direct-path call, put in its entry's place in the recorder (set by the backend).
#     mpi_error: ``mpi_error(call, error)`` raises an MPI error of a direct-path call as the
#         front end's ``CollectivesError``, the communicator dead.
#     grouped, held: inside ``Communicator.group()``, and the ``Work`` of each direct-path
#         call made there (a list, which the group waits for as it ends; None outside).
#     front: the ``Communicator``, whose ``_wait``/``_synchronize`` finish a direct-path
#         ``Work`` handed over as a ``Pending``; in_flight: the direct-path ``Work``s not yet
#         complete (held so that MPI's arrays outlive a dropped ``Work``; ``hand_over()``
#         gives them all to the backend before a close or abort).
#     handle, rank, size, blocking: the direct path's MPI communicator (in the form
#         ``_direct.handle`` gives), this rank and the size, and whether its synchronous
#         collectives are blocking MPI calls.
#     kept_bytes: bytes a rank up to which a synchronous collective is a persistent MPI
#         request kept from call to call (``_callbooks_kept.c``: made once per kind, count,
#         dtype, op and root, polled under the timeout; 0: none, where ranks may mix the
#         forms of a call); ``let_go_kept()`` frees them before the communicator is freed.
#         kept_all_to_all_in_place: a kept all_to_all is MPI's in-place form (MPICH's faster).
#     owner: ``threading.get_ident()`` of the thread that owns the communicator (0: none
#         known yet); the direct path leaves any other thread's call to the general path,
#         which refuses it.
__all__ = ["IN_USE", "CallBooks", "Entry"]
