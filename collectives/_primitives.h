/* What the direct path's MPI primitives (_fastmpi.c, built once per MPI ABI) hand the books
 * (_callbooks.c): two C functions behind a capsule, so that a call goes from the books to
 * MPI without Python in between. The kinds are in the order of _direct.KINDS. */
#ifndef COLLECTIVES_PRIMITIVES_H
#define COLLECTIVES_PRIMITIVES_H

enum { ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, GATHER, SCATTER,
       SEND, RECV, BARRIER, SENDRECV, KINDS };

/* the name of the capsule that _fastmpi's `primitives` is */
#define PRIMITIVES_CAPSULE "collectives._fastmpi.primitives"

typedef struct {
    /* Posts the MPI call `kind` on `send` and `recv` (NULL where the caller gave None: then
     * MPI_IN_PLACE where the call has an in-place form), `count` elements (per rank for the
     * calls that split by rank); `comm`, `datatype` and `op` are handles as mpi4py gives
     * them, `root` the root or the peer (a SENDRECV's destination), `source` a SENDRECV's
     * source. A blocking call (any kind but SEND and RECV, which are never blocking)
     * returns once done and leaves *request 0. `counts`: NULL, or for REDUCE_SCATTER each
     * rank's count (one per rank, `count_bytes` wide, alive until the request completes):
     * then MPI_(I)reduce_scatter, which some libraries run with a faster algorithm than
     * MPI_(I)reduce_scatter_block. A REDUCE_SCATTER with `source` 0 or more is two ranks'
     * exchange instead: `send` (the `count` elements the peer keeps) goes to `root`, and
     * `recv` gets the peer's part of ours from `source` (MPI_(I)sendrecv under a tag of its
     * own); the caller reduces it with reduce_local. The MPI error code, or 0. Touches no
     * Python object: the caller may release the GIL around it. */
    int (*post)(int kind, int blocking, unsigned long long comm, const void *send, void *recv,
                long long count, unsigned long long datatype, unsigned long long op, int root,
                int source, const void *counts, unsigned long long *request);
    /* MPI_Test on *request until it completes (*done 1) or HAND_BACK seconds past
     * `yield_after` have passed (*done 0): busy for `yield_after`, then yielding the core
     * after every YIELD_EVERY tests; one test where `yield_after` is below 0. The MPI error
     * code, or 0.
     * Touches no Python object. */
    int (*poll)(unsigned long long *request, double yield_after, int *done);
    /* the width of a count in post's `counts`: MPI_Count's, or int's where no large-count
     * calls are used (Open MPI) */
    int count_bytes;
    /* The persistent form of collective `kind` (MPI 4.0's MPI_<call>_init; not SEND, RECV,
     * SENDRECV), arguments as post() takes them: *request, inactive until start(). NULL
     * where this MPI lacks one of them. The MPI error code, or 0. Touches no Python object. */
    int (*init)(int kind, unsigned long long comm, const void *send, void *recv,
                long long count, unsigned long long datatype, unsigned long long op, int root,
                unsigned long long *request);
    /* MPI_Start and MPI_Request_free of a persistent request (free leaves *request null) */
    int (*start)(unsigned long long *request);
    int (*release)(unsigned long long *request);
    /* MPI_Reduce_local: inout = in op inout, `count` elements (NULL where this MPI lacks
     * it). The MPI error code, or 0. Touches no Python object. */
    int (*reduce_local)(const void *in, void *inout, long long count,
                        unsigned long long datatype, unsigned long long op);
} Primitives;

#endif
