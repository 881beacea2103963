/* What the three files of the books' module share (collectives._callbooks: _callbooks.c the
 * types and the module, _callbooks_run.c the numbering and one call, _callbooks_verbs.c the
 * verbs' argument checks). */
#ifndef COLLECTIVES_CALLBOOKS_H
#define COLLECTIVES_CALLBOOKS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>
#include <string.h>
#include <time.h>

#include "_primitives.h"

/* set once by configure() and use_primitives() (_books.py, _direct.py) */
extern const Primitives *primitives; /* NULL: the mpi4py primitives */
extern PyObject *py_post, *py_poll;  /* _direct._py_post and _py_poll */
extern PyObject *py_reduce_local;    /* _direct._py_reduce_local */
extern PyObject *mpi_exception;      /* mpi4py's MPI.Exception: made from an error code */
extern PyObject *point_to_point;     /* _check.POINT_TO_POINT: not numbered as collectives */
extern PyObject *in_use_error;       /* CommunicatorStateError, and the words it says */
extern PyObject *in_use_text;
extern PyObject *ndarray;    /* numpy.ndarray */
extern PyObject *fast_type;  /* _direct.FAST_TYPE: dtype -> (name, datatype handle) */
extern PyObject *fast_op;    /* _direct.FAST_OP: op -> (ReduceOp, op handle) */
extern PyObject *reduce_op;  /* the ReduceOp class */
extern PyObject *empty;      /* numpy.empty */
extern PyObject *kind_names; /* _direct.KINDS, a tuple of str */
extern int counted_reduce_scatter; /* reduce_scatters given counts: 1 non-blocking, 2 blocking */
extern Py_ssize_t counted_from;    /* bytes per rank from which they are */
extern int sendrecv_posted;        /* the primitives post SENDRECV (MPI_Isendrecv): 1, or 0 */
extern int exchanges;              /* _direct.EXCHANGES: a two-rank reduce_scatter may be one */
extern PyObject *s_append, *s_pop, *s_verify, *s_shape, *s_dtype, *s_synchronous, *s_async_op;

static inline double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One direct-path call in the flight recorder. */
typedef struct {
    PyObject_HEAD
    long long seq;
    PyObject *call, *shape, *dtype;
    double start, end;
} Entry;

PyObject *new_entry(long long seq, PyObject *call, PyObject *shape, PyObject *dtype);

/* A persistent request kept for small synchronous calls (_callbooks_kept.c). */
typedef struct Kept Kept;

/* The per-call state of one communicator (_books.py documents the fields). */
typedef struct {
    PyObject_HEAD
    char busy;                /* a call holds the communicator (the thread token) */
    char grouped, blocking;
    long long seq, p2p, next_check;
    Py_ssize_t slot;
    int rank, size;
    double yield_after, last_call, quiet;
    unsigned long owner;
    PyObject *slots, *inside; /* the progress board's words (int64), or None */
    long long *slot_word, *inside_word;
    Py_buffer slots_view, inside_view;
    PyObject *checker, *recorder, *wait_long, *pending, *mpi_error, *held, *handle;
    PyObject *record;    /* recorder.append, bound once */
    PyObject *front;     /* the Communicator: a Work's waits past the direct path are its */
    PyObject *in_flight; /* the direct path's Works not yet complete (a set) */
    Py_ssize_t reap_at;  /* in_flight's size at which those complete are looked for */
    PyObject *scratch;   /* a bytearray for the results of in-place forms, or NULL */
    Kept *kept;          /* the persistent requests of small synchronous calls, or NULL */
    Py_ssize_t kept_bytes; /* bytes per rank up to which a synchronous call is kept (0: none) */
    char kept_all_to_all_in_place; /* a kept all_to_all is MPI's in-place form, on one stage */
    unsigned long long kept_clock; /* calls kept so far: when each request was last used */
} CallBooks;

extern PyTypeObject CallBooksType;

/* A copy made once a call completes: `bytes` from `from` (the memory of `owner`) to `to`,
 * memory that the call holds until then. Where `op` is set, `to = from op to` instead
 * (MPI_Reduce_local of `count` elements of `datatype`; `op` and `datatype` are FAST_OP's
 * and FAST_TYPE's, which live as long as the module). */
typedef struct {
    void *to;
    const void *from;
    Py_ssize_t bytes;
    PyObject *owner;
    PyObject *op, *datatype;
    long long count;
} Copy;

/* One checked direct-path call (the arguments of run()); the verbs make it with new_call()
 * and set its fields by name. */
typedef struct {
    int kind;
    PyObject *array, *name, *op, *root; /* for the books: what check mode compares */
    PyObject *result, *send, *recv;     /* send, recv: arrays, or None */
    long long count;
    PyObject *datatype, *mpi_op; /* handles (C primitives) or mpi4py objects */
    int root_rank;               /* the root, or the peer (a sendrecv's destination) */
    int source_rank;             /* a sendrecv's source */
    int async_op;
    int counted;       /* a reduce_scatter large enough to be given each rank's count */
    /* a two-rank reduce_scatter made as one exchange with the peer (root_rank, and
     * source_rank: -1 for every other reduce_scatter); `copy` reduces what it got */
    int exchange;
    /* the memory of send and recv where the verb holds their buffers, else NULL (then the
     * call takes their buffers itself: an array the verb made) */
    const void *send_at;
    void *recv_at;
    const Py_buffer *array_view; /* `array`'s buffer where the verb holds it, else NULL */
    /* made once the call completes (the in-place reduce_scatter's result, from recv to the
     * call's result; an exchange's reduction); no bytes: none */
    Copy copy;
} Call;

/* _callbooks_run.c */
PyObject *run(CallBooks *b, const Call *c);
unsigned long long handle_of(PyObject *value, int *failed);
int poll_call(double yield_after, PyObject **request_obj, unsigned long long *request);
PyObject *raise_mpi_error(CallBooks *b, PyObject *call);
int make_copy(const Copy *k);
PyObject *scratch(CallBooks *b, Py_ssize_t nbytes);
PyObject *CallBooks_take(CallBooks *b, PyObject *call);
PyObject *CallBooks_give(CallBooks *b, PyObject *unused);
PyObject *CallBooks_number(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);

/* _callbooks_kept.c: small synchronous calls as persistent MPI requests */
Kept *kept_for(CallBooks *b, const Call *c, int *failed);
void kept_in(CallBooks *b, const Kept *k, const void *send, const void *recv);
void kept_out(CallBooks *b, Kept *k, void *recv);
unsigned long long *kept_request(Kept *k);
PyObject *CallBooks_let_go_kept(CallBooks *b, PyObject *unused);
void kept_drop(CallBooks *b);

/* _callbooks_verbs.c: each verb's checks, then run() */
PyObject *CallBooks_all_reduce(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_broadcast(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_reduce(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_all_gather(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_reduce_scatter(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_all_to_all(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_gather(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_scatter(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_send(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_recv(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_sendrecv(CallBooks *b, PyObject *const *args, Py_ssize_t nargs);
PyObject *CallBooks_barrier(CallBooks *b, PyObject *async_op);

/* _callbooks_work.c: the Work of a call made with async_op=True */
extern PyTypeObject WorkType;
PyObject *direct_work(CallBooks *b, PyObject *request_obj, unsigned long long request,
                      PyObject *entry, PyObject *arrays, const Call *c);
PyObject *CallBooks_hand_over(CallBooks *b, PyObject *unused);
int work_ready(void);
#define REAP_AT 64 /* in_flight's size from which Works complete are looked for */

/* _callbooks_front.c: the communicator's verbs, the direct path first */
extern PyTypeObject DirectVerbType;
int front_ready(void);

#endif
