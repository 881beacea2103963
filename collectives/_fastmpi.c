/* The direct path in C: a synchronous all_reduce or broadcast of a NumPy array on the MPI
 * backend, from the argument checks to the completed call.
 *
 * Python costs per call about what small messages take on the wire, so this module does
 * here what collectives/_direct.py does in Python (and that module is the reference and the
 * fallback): the same checks, then the same bookkeeping (collectives/_books.py: the thread
 * token, numbering, check mode, the progress board, the flight recorder), read and written on
 * the communicator's CallBooks by their documented names, then it posts the non-blocking MPI
 * call and polls it with the GIL released. A call that lasts past `yield_after` is handed to
 * the books' `wait_long`, which waits under the timeout. run(), begin() and post_and_wait()
 * are the C twin of _direct._run: change them together.
 *
 * Anything unusual (another type, dtype, op or layout, a bad root, a thread holding the
 * communicator) returns NotImplemented before any bookkeeping: the general path then runs
 * the call, or raises the error it names.
 *
 * The MPI functions are the ones mpi4py's libmpi exports, passed in as addresses by setup():
 * this module links against no MPI. It is built twice, once per ABI, and _direct.py picks the
 * build that matches mpi4py's library before setup():
 *   collectives._fastmpi       the MPICH ABI (int handles, the MPI-4 large-count calls with a
 *                              64-bit MPI_Count): MPICH, Intel MPI, Cray MPICH, MVAPICH;
 *   collectives._fastmpi_ompi  Open MPI's (pointer handles, int counts: Open MPI 5.0 has no
 *                              large-count calls, so a larger count goes the general path).
 * Where a library's blocking collectives are faster than its non-blocking ones, a communicator
 * may ask for the blocking calls (its books' `blocking`): the wait then happens inside MPI,
 * and a stuck call is ended by _direct.py's watchdog, which aborts the job.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX: how __slots__ fields are stored */
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#ifdef FASTMPI_POINTER_HANDLES
typedef intptr_t Handle; /* MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request: pointers */
typedef int Count;       /* the count of the calls without _c */
#define COUNT_MAX INT_MAX
#define MODULE_NAME "collectives._fastmpi_ompi"
#define MODULE_INIT PyInit__fastmpi_ompi
#else
typedef int Handle;      /* MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request */
typedef long long Count; /* MPI_Count */
#define COUNT_MAX LLONG_MAX
#define MODULE_NAME "collectives._fastmpi"
#define MODULE_INIT PyInit__fastmpi
#endif
typedef int (*IallreduceFn)(const void *, void *, Count, Handle, Handle, Handle, Handle *);
typedef int (*IbcastFn)(void *, Count, Handle, int, Handle, Handle *);
typedef int (*AllreduceFn)(const void *, void *, Count, Handle, Handle, Handle);
typedef int (*BcastFn)(void *, Count, Handle, int, Handle);
typedef int (*TestFn)(Handle *, int *, void *);

static IallreduceFn mpi_iallreduce;
static IbcastFn mpi_ibcast;
static AllreduceFn mpi_allreduce; /* the blocking calls, for communicators that ask for them */
static BcastFn mpi_bcast;
static TestFn mpi_test;
static void *mpi_in_place;
static PyObject *mpi_error;           /* mpi4py's MPI.Exception: called with the error code */
static PyObject *request_from_handle; /* MPI.Request.fromhandle */
static PyObject *ndarray;             /* numpy.ndarray */
static PyObject *fast_type;           /* _direct.FAST_TYPE: dtype -> (name, datatype handle) */
static PyObject *fast_op;             /* _direct.FAST_OP: op -> (ReduceOp, op handle) */
static PyObject *reduce_op;           /* the ReduceOp class */
static PyObject *books_type;          /* _books.CallBooks */

/* attribute and call names, interned once */
static PyObject *s_dtype, *s_shape, *s_verify, *s_append, *s_pop, *s_all_reduce, *s_broadcast;

/* The CallBooks fields this path reads and writes, by name. CallBooks has __slots__, so each
 * field sits at a fixed offset in the object: setup() finds it once from the class's member
 * descriptor, and a call (whose books are checked to be exactly a CallBooks) reads it there,
 * as the descriptor itself would, without an attribute lookup per field. */
enum { F_TOKEN, F_SEQ, F_P2P, F_SLOTS, F_SLOT, F_CHECKER, F_RECORDER, F_YIELD_AFTER,
       F_WAIT_LONG, F_HANDLE, F_RANK, F_SIZE, F_BLOCKING, F_NEXT_CHECK, F_LAST_CALL, F_QUIET,
       F_OWNER, F_INSIDE, F_COUNT };
static const char *const field_names[F_COUNT] = {
    "token",     "seq",    "p2p",  "slots", "slot",     "checker",    "recorder",  "yield_after",
    "wait_long", "handle", "rank", "size",  "blocking", "next_check", "last_call", "quiet",
    "owner",     "inside"};
static Py_ssize_t field_offsets[F_COUNT];

/* books.<field>, a new reference, or NULL with AttributeError where it was never set. */
static PyObject *field(PyObject *books, int f)
{
    PyObject *value = *(PyObject **)((char *)books + field_offsets[f]);
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "CallBooks.%s is not set", field_names[f]);
        return NULL;
    }
    Py_INCREF(value);
    return value;
}

/* books.<field> = value (value is not stolen). */
static void set_field(PyObject *books, int f, PyObject *value)
{
    Py_INCREF(value);
    Py_XSETREF(*(PyObject **)((char *)books + field_offsets[f]), value);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Poll `request` (the GIL released) until it completes or has lasted `yield_after`. */
static int poll(Handle *request, int *done, double yield_after)
{
    int status[16]; /* MPI_Status is 20 bytes under the MPICH ABI, 24 under Open MPI's */
    double start = now();
    unsigned polls = 0;
    int rc;
    while ((rc = mpi_test(request, done, status)) == 0 && !*done) {
        if ((++polls & 255) == 0 && now() - start > yield_after)
            break;
    }
    return rc;
}

static void raise_mpi_error(int rc)
{
    PyObject *error = PyObject_CallFunction(mpi_error, "i", rc);
    if (error != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        Py_DECREF(error);
    }
}

/* mpi4py gives int handles sign-extended to 64 bits (their low 32 bits are the handle), and
 * pointer handles as their address. */
static int as_handle(PyObject *value, Handle *handle)
{
    unsigned long long v = PyLong_AsUnsignedLongLongMask(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
#ifdef FASTMPI_POINTER_HANDLES
    *handle = (Handle)(uintptr_t)v;
#else
    *handle = (Handle)(unsigned)v;
#endif
    return 0;
}

/* A C-contiguous buffer of `array` (writable if asked), or 0 with no error set. */
static int take_buffer(PyObject *array, Py_buffer *view, int writable)
{
    if (PyObject_GetBuffer(array, view, PyBUF_ND | (writable ? PyBUF_WRITABLE : 0)) == 0)
        return 1;
    PyErr_Clear(); /* not ours to judge: the general path names what is wrong */
    return 0;
}

static int same_shape(const Py_buffer *a, const Py_buffer *b)
{
    return a->ndim == b->ndim &&
           (a->ndim == 0 || memcmp(a->shape, b->shape, a->ndim * sizeof(Py_ssize_t)) == 0);
}

static int apart(const Py_buffer *a, const Py_buffer *b)
{
    const char *a0 = a->buf, *b0 = b->buf;
    return a->len == 0 || b->len == 0 || a0 + a->len <= b0 || b0 + b->len <= a0;
}

/* One call, once its arguments have passed (_direct._run is the same in Python). */
typedef struct {
    PyObject *books, *call, *array, *name, *op, *root; /* borrowed */
    PyObject *keep;     /* the arrays (and table entries), for wait_long to hold */
    void *send, *recv;  /* all_reduce: send NULL in place; broadcast: recv only */
    Count count;
    Handle datatype, mpi_op;
    int root_rank;
    long long nth; /* its collective number, set by begin() */
} Call;

/* books.<field> as a C long long: 0, or -1 with an error set. */
static int get_long(PyObject *books, int f, long long *value)
{
    PyObject *v = field(books, f);
    if (v == NULL)
        return -1;
    *value = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *value == -1 && PyErr_Occurred() ? -1 : 0;
}

/* books.<field> as a C double: 0, or -1 with an error set. */
static int get_double(PyObject *books, int f, double *value)
{
    PyObject *v = field(books, f);
    if (v == NULL)
        return -1;
    *value = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return *value == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* Whether the guard verifies collective `nth` (CallBooks.number's rule); books.last_call is
 * set to now. 1, 0, or -1 with an error set. */
static int due(PyObject *books, long long nth)
{
    long long next;
    double last, quiet, t = now();
    if (get_long(books, F_NEXT_CHECK, &next) < 0 || get_double(books, F_LAST_CALL, &last) < 0 ||
        get_double(books, F_QUIET, &quiet) < 0)
        return -1;
    PyObject *t_obj = PyFloat_FromDouble(t);
    if (t_obj == NULL)
        return -1;
    set_field(books, F_LAST_CALL, t_obj);
    Py_DECREF(t_obj);
    return nth >= next || t - last > quiet;
}

/* Write this rank's collective number `nth` to books.slots[books.slot]. */
static int post_progress(PyObject *books, long long nth)
{
    long long slot;
    if (get_long(books, F_SLOT, &slot) < 0)
        return -1;
    PyObject *slots = field(books, F_SLOTS);
    if (slots == NULL)
        return -1;
    Py_buffer view;
    int rc = PyObject_GetBuffer(slots, &view, PyBUF_WRITABLE);
    Py_DECREF(slots);
    if (rc < 0)
        return -1;
    if (slot < 0 || slot >= view.len / (Py_ssize_t)sizeof(long long) ||
        view.itemsize != (Py_ssize_t)sizeof(long long)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_IndexError, "CallBooks.slot is not a slot of CallBooks.slots");
        return -1;
    }
    ((long long *)view.buf)[slot] = nth;
    PyBuffer_Release(&view);
    return 0;
}

/* CallBooks.number for a collective, then a flight-recorder entry, appended: the entry. */
static PyObject *begin(Call *c)
{
    long long seq, p2p;
    if (get_long(c->books, F_SEQ, &seq) < 0 || get_long(c->books, F_P2P, &p2p) < 0)
        return NULL;
    seq += 1;
    long long nth = c->nth = seq - p2p;
    PyObject *seq_new = PyLong_FromLongLong(seq);
    if (seq_new == NULL)
        return NULL;
    set_field(c->books, F_SEQ, seq_new);
    if (post_progress(c->books, nth) < 0) {
        Py_DECREF(seq_new);
        return NULL;
    }
    PyObject *checker = field(c->books, F_CHECKER);
    if (checker == NULL) {
        Py_DECREF(seq_new);
        return NULL;
    }
    int verify = checker == Py_None ? 0 : due(c->books, nth);
    if (verify < 0) {
        Py_DECREF(checker);
        Py_DECREF(seq_new);
        return NULL;
    }
    if (verify) {
        PyObject *nth_obj = PyLong_FromLongLong(nth);
        PyObject *r = nth_obj == NULL ? NULL
                                      : PyObject_CallMethodObjArgs(checker, s_verify, nth_obj,
                                                                   c->call, c->array, c->name,
                                                                   c->op, c->root, NULL);
        Py_XDECREF(nth_obj);
        Py_DECREF(checker);
        if (r == NULL) {
            Py_DECREF(seq_new);
            return NULL;
        }
        Py_DECREF(r);
    } else {
        Py_DECREF(checker);
    }
    PyObject *shape = PyObject_GetAttr(c->array, s_shape);
    PyObject *entry = shape == NULL ? NULL : PyList_New(6);
    if (entry == NULL) {
        Py_XDECREF(shape);
        Py_DECREF(seq_new);
        return NULL;
    }
    Py_INCREF(c->call);
    Py_INCREF(c->name);
    PyList_SET_ITEM(entry, 0, seq_new);
    PyList_SET_ITEM(entry, 1, c->call);
    PyList_SET_ITEM(entry, 2, shape);
    PyList_SET_ITEM(entry, 3, c->name);
    PyList_SET_ITEM(entry, 4, PyFloat_FromDouble(now()));
    PyList_SET_ITEM(entry, 5, PyFloat_FromDouble(0.0));
    PyObject *recorder = field(c->books, F_RECORDER);
    PyObject *r = recorder == NULL ? NULL : PyObject_CallMethodOneArg(recorder, s_append, entry);
    Py_XDECREF(recorder);
    if (r == NULL) {
        Py_DECREF(entry);
        return NULL;
    }
    Py_DECREF(r);
    return entry;
}

/* &books.inside[books.slot], where a blocking call posts that this rank is inside it (NULL
 * where books.inside is None), its buffer held in *view until released. 0, or -1 with an
 * error set. */
static int inside_word(const Call *c, Py_buffer *view, long long **word)
{
    long long slot;
    PyObject *inside = field(c->books, F_INSIDE);
    if (inside == NULL)
        return -1;
    int rc = inside == Py_None ? 0
             : get_long(c->books, F_SLOT, &slot) < 0
                 ? -1
                 : PyObject_GetBuffer(inside, view, PyBUF_WRITABLE);
    int held = inside != Py_None && rc == 0;
    Py_DECREF(inside);
    if (rc < 0)
        return -1;
    if (!held)
        return 0;
    if (slot < 0 || slot >= view->len / (Py_ssize_t)sizeof(long long) ||
        view->itemsize != (Py_ssize_t)sizeof(long long)) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_IndexError, "CallBooks.slot is not a slot of CallBooks.inside");
        return -1;
    }
    *word = (long long *)view->buf + slot;
    return 0;
}

/* Post the call and poll it; hand it to books.wait_long if it lasts. 0, or -1 with an error. */
static int post_and_wait(const Call *c, PyObject *entry)
{
    double yield_after;
    PyObject *y = field(c->books, F_YIELD_AFTER);
    if (y == NULL)
        return -1;
    yield_after = PyFloat_AsDouble(y);
    Py_DECREF(y);
    if (yield_after == -1.0 && PyErr_Occurred())
        return -1;
    PyObject *handle = field(c->books, F_HANDLE);
    PyObject *blocking_obj = handle == NULL ? NULL : field(c->books, F_BLOCKING);
    Handle comm, request = 0;
    int failed = blocking_obj == NULL || as_handle(handle, &comm) < 0;
    int blocking = blocking_obj == Py_True;
    Py_XDECREF(handle);
    Py_XDECREF(blocking_obj);
    if (failed)
        return -1;
    /* A blocking call cannot post anything once begun: the board says beforehand that this
     * rank is inside it (nth * 4 + code, as _progress.BLOCKING_CALLS), and 0 once it returns */
    Py_buffer inside;
    long long *word = NULL;
    if (blocking && inside_word(c, &inside, &word) < 0)
        return -1;
    if (word != NULL)
        *word = c->nth * 4 + (c->call == s_all_reduce ? 1 : 2);
    int rc, posted = 0, done = 0;
    Py_BEGIN_ALLOW_THREADS
    if (blocking) {
        if (c->call == s_all_reduce)
            rc = mpi_allreduce(c->send ? c->send : mpi_in_place, c->recv, c->count, c->datatype,
                               c->mpi_op, comm);
        else
            rc = mpi_bcast(c->recv, c->count, c->datatype, c->root_rank, comm);
        done = 1;
    } else {
        if (c->call == s_all_reduce)
            rc = mpi_iallreduce(c->send ? c->send : mpi_in_place, c->recv, c->count,
                                c->datatype, c->mpi_op, comm, &request);
        else
            rc = mpi_ibcast(c->recv, c->count, c->datatype, c->root_rank, comm, &request);
        if (rc == 0) {
            posted = 1;
            rc = poll(&request, &done, yield_after);
        }
    }
    Py_END_ALLOW_THREADS
    if (word != NULL) {
        *word = 0;
        PyBuffer_Release(&inside);
    }
    if (rc != 0) {
        if (!posted) { /* posting failed: nothing is in flight to record */
            PyObject *recorder = field(c->books, F_RECORDER);
            PyObject *r = recorder == NULL ? NULL : PyObject_CallMethodNoArgs(recorder, s_pop);
            Py_XDECREF(recorder);
            Py_XDECREF(r);
            PyErr_Clear();
        } /* polling failed: the call was posted, so its entry stays, never completed */
        raise_mpi_error(rc);
        return -1;
    }
    if (!done) {
        /* mpi4py takes handles sign-extended to 64 bits, as it gives them */
        PyObject *req = PyObject_CallFunction(request_from_handle, "K",
                                              (unsigned long long)(long long)request);
        PyObject *wait_long = req == NULL ? NULL : field(c->books, F_WAIT_LONG);
        PyObject *r = wait_long == NULL ? NULL
                                        : PyObject_CallFunctionObjArgs(wait_long, req, entry,
                                                                       c->keep, NULL);
        Py_XDECREF(req);
        Py_XDECREF(wait_long);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    PyObject *end = PyFloat_FromDouble(now());
    if (end == NULL)
        return -1;
    PyList_SetItem(entry, 5, end);
    return 0;
}

static PyObject *NotImplemented(void)
{
    Py_RETURN_NOTIMPLEMENTED; /* a count this ABI's calls cannot take: the general path's */
}

/* The thread guards around begin() and post_and_wait(). NotImplemented: not the owner
 * thread, or the token is taken. */
static PyObject *run(Call *c, PyObject *result)
{
    PyObject *owner = field(c->books, F_OWNER);
    if (owner == NULL)
        return NULL;
    unsigned long owner_id = PyLong_AsUnsignedLongMask(owner);
    Py_DECREF(owner);
    if (owner_id == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (owner_id != PyThread_get_thread_ident())
        Py_RETURN_NOTIMPLEMENTED; /* not the owner thread's call: the general path refuses it */
    PyObject *token = field(c->books, F_TOKEN);
    if (token == NULL)
        return NULL;
    if (!PyList_CheckExact(token)) {
        Py_DECREF(token);
        PyErr_SetString(PyExc_TypeError, "books.token must be a list");
        return NULL;
    }
    if (PyList_GET_SIZE(token) == 0) {
        Py_DECREF(token);
        Py_RETURN_NOTIMPLEMENTED; /* another thread's call: the general path says so */
    }
    if (PyList_SetSlice(token, 0, 1, NULL) < 0) {
        Py_DECREF(token);
        return NULL;
    }
    PyObject *entry = begin(c);
    int failed = entry == NULL || post_and_wait(c, entry) < 0;
    Py_XDECREF(entry);
    int lost = PyList_Append(token, Py_None) < 0;
    Py_DECREF(token);
    if (lost || failed)
        return NULL;
    Py_INCREF(result);
    return result;
}

/* The arguments every call starts with: (books, ...), `expected` of them in all. */
static int check_arguments(const char *call, PyObject *const *args, Py_ssize_t nargs,
                           Py_ssize_t expected)
{
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", call, expected);
        return -1;
    }
    if ((PyObject *)Py_TYPE(args[0]) != books_type) {
        PyErr_SetString(PyExc_TypeError, "books must be a collectives._books.CallBooks");
        return -1;
    }
    return 0;
}

/* all_reduce(books, x, op, out): x reduced into out (None: in place), or NotImplemented. */
static PyObject *all_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (check_arguments("all_reduce", args, nargs, 4) < 0)
        return NULL;
    PyObject *x = args[1], *op = args[2], *out = args[3];
    if ((PyObject *)Py_TYPE(x) != ndarray ||
        !(PyUnicode_CheckExact(op) || (PyObject *)Py_TYPE(op) == reduce_op))
        Py_RETURN_NOTIMPLEMENTED;
    int in_place = out == Py_None || out == x;
    if (!in_place && (PyObject *)Py_TYPE(out) != ndarray)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *dtype = PyObject_GetAttr(x, s_dtype);
    if (dtype == NULL)
        return NULL;
    PyObject *types = PyDict_GetItemWithError(fast_type, dtype); /* borrowed */
    PyObject *ops = types == NULL ? NULL : PyDict_GetItemWithError(fast_op, op);
    int same_dtype = 1;
    if (ops != NULL && !in_place) {
        PyObject *out_dtype = PyObject_GetAttr(out, s_dtype);
        if (out_dtype == NULL) {
            Py_DECREF(dtype);
            return NULL;
        }
        same_dtype = out_dtype == dtype;
        Py_DECREF(out_dtype);
    }
    Py_DECREF(dtype);
    if (PyErr_Occurred())
        return NULL;
    if (ops == NULL || !same_dtype)
        Py_RETURN_NOTIMPLEMENTED;

    Py_buffer xb, ob;
    if (!take_buffer(x, &xb, in_place))
        Py_RETURN_NOTIMPLEMENTED;
    if (!in_place) {
        if (!take_buffer(out, &ob, 1)) {
            PyBuffer_Release(&xb);
            Py_RETURN_NOTIMPLEMENTED;
        }
        if (!same_shape(&xb, &ob) || !apart(&xb, &ob)) { /* the general path judges overlap */
            PyBuffer_Release(&ob);
            PyBuffer_Release(&xb);
            Py_RETURN_NOTIMPLEMENTED;
        }
    }
    PyObject *result = in_place ? x : out, *done = NULL;
    /* the table entries are held: check mode and the recorder run Python in between */
    PyObject *keep = PyTuple_Pack(4, x, result, types, ops);
    Call c = {args[0], s_all_reduce, x, PyTuple_GET_ITEM(types, 0),
              PyTuple_GET_ITEM(ops, 0), Py_None, keep, NULL, NULL, 0, 0, 0, 0, 0};
    if (keep != NULL && as_handle(PyTuple_GET_ITEM(types, 1), &c.datatype) == 0 &&
        as_handle(PyTuple_GET_ITEM(ops, 1), &c.mpi_op) == 0) {
        Py_ssize_t count = xb.len / (xb.itemsize ? xb.itemsize : 1);
        c.count = (Count)count;
        c.send = in_place ? NULL : xb.buf;
        c.recv = in_place ? xb.buf : ob.buf;
        done = (long long)count > (long long)COUNT_MAX ? NotImplemented() : run(&c, result);
    }
    Py_XDECREF(keep);
    if (!in_place)
        PyBuffer_Release(&ob);
    PyBuffer_Release(&xb);
    return done;
}

/* broadcast(books, x, root): x from root on every rank, or NotImplemented. */
static PyObject *broadcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (check_arguments("broadcast", args, nargs, 3) < 0)
        return NULL;
    PyObject *x = args[1], *root = args[2];
    if ((PyObject *)Py_TYPE(x) != ndarray || !PyLong_CheckExact(root))
        Py_RETURN_NOTIMPLEMENTED;
    long long root_rank = PyLong_AsLongLong(root), rank, size;
    if (root_rank == -1 && PyErr_Occurred())
        PyErr_Clear(); /* a root too large for a C long long: out of range below */
    if (get_long(args[0], F_RANK, &rank) < 0 || get_long(args[0], F_SIZE, &size) < 0)
        return NULL;
    if (root_rank < 0 || root_rank >= size)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *dtype = PyObject_GetAttr(x, s_dtype);
    if (dtype == NULL)
        return NULL;
    PyObject *types = PyDict_GetItemWithError(fast_type, dtype);
    Py_DECREF(dtype);
    if (types == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NOTIMPLEMENTED;
    }
    Py_buffer xb;
    if (!take_buffer(x, &xb, root_rank != rank)) /* the root only reads x */
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *done = NULL, *keep = PyTuple_Pack(2, x, types);
    Call c = {args[0], s_broadcast, x, PyTuple_GET_ITEM(types, 0), Py_None, root,
              keep, NULL, NULL, 0, 0, 0, (int)root_rank, 0};
    if (keep != NULL && as_handle(PyTuple_GET_ITEM(types, 1), &c.datatype) == 0) {
        Py_ssize_t count = xb.len / (xb.itemsize ? xb.itemsize : 1);
        c.count = (Count)count;
        c.recv = xb.buf;
        done = (long long)count > (long long)COUNT_MAX ? NotImplemented() : run(&c, x);
    }
    Py_XDECREF(keep);
    PyBuffer_Release(&xb);
    return done;
}

/* setup(iallreduce, ibcast, allreduce, bcast, test, in_place, error,
 *       request_from_handle, ndarray, fast_type, fast_op, reduce_op, books_type) */
static PyObject *setup(PyObject *self, PyObject *args)
{
    unsigned long long iallreduce, ibcast, allreduce, bcast, test;
    long long in_place;
    PyObject *objects[7];
    PyObject **slots[7] = {&mpi_error, &request_from_handle, &ndarray,   &fast_type,
                           &fast_op,   &reduce_op,           &books_type};
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKKKLOOOO!O!OO!", &iallreduce, &ibcast, &allreduce, &bcast,
                          &test, &in_place, &objects[0], &objects[1], &objects[2],
                          &PyDict_Type, &objects[3], &PyDict_Type, &objects[4], &objects[5],
                          &PyType_Type, &objects[6]))
        return NULL;
    mpi_iallreduce = (IallreduceFn)(uintptr_t)iallreduce;
    mpi_ibcast = (IbcastFn)(uintptr_t)ibcast;
    mpi_allreduce = (AllreduceFn)(uintptr_t)allreduce;
    mpi_bcast = (BcastFn)(uintptr_t)bcast;
    mpi_test = (TestFn)(uintptr_t)test;
    mpi_in_place = (void *)(intptr_t)in_place;
    for (int f = 0; f < F_COUNT; f++) { /* before anything is kept: a failure keeps nothing */
        PyObject *descriptor = PyDict_GetItemString(((PyTypeObject *)objects[6])->tp_dict,
                                                    field_names[f]);
        if (descriptor == NULL || !Py_IS_TYPE(descriptor, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)descriptor)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "books_type has no __slots__ field %s",
                         field_names[f]);
            return NULL;
        }
        field_offsets[f] = ((PyMemberDescrObject *)descriptor)->d_member->offset;
    }
    for (int i = 0; i < 7; i++) {
        Py_INCREF(objects[i]);
        Py_XSETREF(*slots[i], objects[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))all_reduce, METH_FASTCALL,
     "all_reduce(books, x, op, out) -> the result, or NotImplemented"},
    {"broadcast", (PyCFunction)(void (*)(void))broadcast, METH_FASTCALL,
     "broadcast(books, x, root) -> x, or NotImplemented"},
    {"setup", setup, METH_VARARGS,
     "setup(iallreduce, ibcast, allreduce, bcast, test, in_place, error, "
     "request_from_handle, ndarray, fast_type, fast_op, reduce_op, books_type)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, MODULE_NAME, NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC MODULE_INIT(void)
{
    struct {
        PyObject **name;
        const char *text;
    } names[] = {
        {&s_dtype, "dtype"},
        {&s_shape, "shape"},
        {&s_verify, "verify"},
        {&s_append, "append"},
        {&s_pop, "pop"},
        {&s_all_reduce, "all_reduce"},
        {&s_broadcast, "broadcast"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].name = PyUnicode_InternFromString(names[i].text);
        if (*names[i].name == NULL)
            return NULL;
    }
    return PyModule_Create(&module);
}
