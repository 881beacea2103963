/* The books a communicator keeps on its calls (collectives/_books.py documents them), in C:
 * the one place that says what a call records and how it runs.
 *
 * Every call, whichever path runs it, is numbered by CallBooks.number (and checked there in
 * check mode, and posted to the progress board). The general path (Communicator._run) takes
 * the thread token with take(), numbers with number(), records the backend's Pending and
 * gives the token back with give(). The direct path (collectives/_direct.py, the calls of
 * NumPy arrays on the MPI backend that need least) hands its checked call to run(), which
 * does all of it here: the token, begin() (number() and a flight-recorder Entry with named
 * fields), the MPI call through the primitives (_fastmpi.c's C functions where they built,
 * _direct.py's on mpi4py otherwise), the poll, and the entry's end. A call that outlasts
 * `yield_after` goes to the books' `wait_long`, one that completes later (async_op, or inside
 * comm.group()) to `later`, both Python, both under the timeout (_deadline.py).
 *
 * all_reduce() and broadcast() are the direct path's two busiest verbs with their argument
 * checks in C too (the others check theirs in _direct.py and call run()).
 *
 * This module is ABI-independent and always built; the primitives it calls are handed in by
 * use_primitives() once, at import of _direct.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>
#include <string.h>
#include <time.h>

#include "_primitives.h"

static const Primitives *primitives; /* NULL: the mpi4py primitives below */
static PyObject *py_post, *py_poll;  /* _direct._py_post and _py_poll */
static PyObject *mpi_exception;      /* mpi4py's MPI.Exception: made from an error code */
static PyObject *point_to_point;     /* _check.POINT_TO_POINT: calls not numbered as collectives */
static PyObject *in_use_error;       /* CommunicatorStateError, and the words it says */
static PyObject *in_use_text;
static PyObject *ndarray;            /* numpy.ndarray */
static PyObject *fast_type;          /* _direct.FAST_TYPE: dtype -> (name, datatype handle) */
static PyObject *fast_op;            /* _direct.FAST_OP: op -> (ReduceOp, op handle) */
static PyObject *reduce_op;          /* the ReduceOp class */
static PyObject *kind_names;         /* _direct.KINDS, a tuple of str */
static PyObject *s_append, *s_pop, *s_verify, *s_shape, *s_dtype;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------------------------- Entry */

typedef struct {
    PyObject_HEAD
    long long seq;
    PyObject *call, *shape, *dtype;
    double start, end;
} Entry;

static PyTypeObject EntryType;

static PyObject *new_entry(long long seq, PyObject *call, PyObject *shape, PyObject *dtype)
{
    Entry *e = PyObject_New(Entry, &EntryType);
    if (e == NULL)
        return NULL;
    e->seq = seq;
    Py_INCREF(call);
    Py_INCREF(shape);
    Py_INCREF(dtype);
    e->call = call;
    e->shape = shape;
    e->dtype = dtype;
    e->start = now();
    e->end = 0.0;
    return (PyObject *)e;
}

static PyObject *Entry_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    long long seq;
    PyObject *call, *shape, *dtype;
    static char *names[] = {"seq", "call", "shape", "dtype", NULL};
    (void)type;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LOOO", names, &seq, &call, &shape, &dtype))
        return NULL;
    return new_entry(seq, call, shape, dtype);
}

static void Entry_dealloc(Entry *e)
{
    Py_DECREF(e->call);
    Py_DECREF(e->shape);
    Py_DECREF(e->dtype);
    PyObject_Free(e);
}

static PyObject *Entry_repr(Entry *e)
{
    return PyUnicode_FromFormat("Entry(seq=%lld, call=%R, shape=%R, dtype=%R)", e->seq, e->call,
                                e->shape, e->dtype);
}

static PyMemberDef entry_members[] = {
    {"seq", T_LONGLONG, offsetof(Entry, seq), READONLY, "the call's number on its communicator"},
    {"call", T_OBJECT, offsetof(Entry, call), READONLY, "the verb"},
    {"shape", T_OBJECT, offsetof(Entry, shape), READONLY, "its array's shape, or None"},
    {"dtype", T_OBJECT, offsetof(Entry, dtype), READONLY, "its dtype's name, or None"},
    {"start", T_DOUBLE, offsetof(Entry, start), READONLY, "monotonic time it began"},
    {"end", T_DOUBLE, offsetof(Entry, end), 0, "monotonic time it completed; 0.0 until then"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives._callbooks.Entry",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Entry(seq, call, shape, dtype): one direct-path call in the flight recorder",
    .tp_new = Entry_new,
    .tp_dealloc = (destructor)Entry_dealloc,
    .tp_repr = (reprfunc)Entry_repr,
    .tp_members = entry_members,
};

/* ---------------------------------------------------------------------------- CallBooks */

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
    PyObject *checker, *recorder, *wait_long, *pending, *mpi_error, *later, *handle;
} CallBooks;

static PyTypeObject CallBooksType;

/* Points *word at words[slot] of `value` (int64 words), its buffer held in *view; None
 * clears it. 0, or -1 with an error set. */
static int hold_word(PyObject *value, Py_ssize_t slot, Py_buffer *view, long long **word,
                     PyObject **keep)
{
    Py_buffer fresh = {0};
    long long *at = NULL;
    if (value != Py_None) {
        if (PyObject_GetBuffer(value, &fresh, PyBUF_CONTIG | PyBUF_FORMAT) < 0)
            return -1;
        if (fresh.itemsize != (Py_ssize_t)sizeof(long long) || slot < 0 ||
            slot >= fresh.len / (Py_ssize_t)sizeof(long long)) {
            PyBuffer_Release(&fresh);
            PyErr_SetString(PyExc_ValueError, "the board must be int64 words with the slot");
            return -1;
        }
        at = (long long *)fresh.buf + slot;
    }
    if (*word != NULL)
        PyBuffer_Release(view);
    *view = fresh;
    *word = at;
    Py_INCREF(value);
    Py_XSETREF(*keep, value);
    return 0;
}

static int CallBooks_init(CallBooks *b, PyObject *args, PyObject *kwargs)
{
    PyObject *slots, *wait_long, *inside = Py_None, *recorder;
    Py_ssize_t slot, length;
    double yield_after;
    int rank, size;
    static char *names[] = {"slots", "slot",  "recorder_length", "yield_after", "wait_long",
                            "rank",  "size",  "inside",          NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnndOii|O", names, &slots, &slot, &length,
                                     &yield_after, &wait_long, &rank, &size, &inside))
        return -1;
    PyObject *deque = PyImport_ImportModule("collections");
    if (deque == NULL)
        return -1;
    recorder = PyObject_CallMethod(deque, "deque", "(()n)", length);
    Py_DECREF(deque);
    if (recorder == NULL)
        return -1;
    b->slot = slot;
    if (hold_word(slots, slot, &b->slots_view, &b->slot_word, &b->slots) < 0 ||
        hold_word(inside, slot, &b->inside_view, &b->inside_word, &b->inside) < 0) {
        Py_DECREF(recorder);
        return -1;
    }
    Py_XSETREF(b->recorder, recorder);
    Py_INCREF(wait_long);
    Py_XSETREF(b->wait_long, wait_long);
    b->yield_after = yield_after;
    b->rank = rank;
    b->size = size;
    b->next_check = 1;
    b->last_call = now();
    b->quiet = Py_HUGE_VAL;
    return 0;
}

static PyObject *CallBooks_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    CallBooks *b = (CallBooks *)type->tp_alloc(type, 0);
    if (b == NULL)
        return NULL;
    PyObject **objects[] = {&b->slots,   &b->inside,  &b->checker, &b->recorder,
                            &b->wait_long, &b->pending, &b->mpi_error, &b->later,
                            &b->handle};
    for (size_t i = 0; i < sizeof objects / sizeof objects[0]; i++) {
        Py_INCREF(Py_None);
        *objects[i] = Py_None;
    }
    return (PyObject *)b;
}

static int CallBooks_traverse(CallBooks *b, visitproc visit, void *arg)
{
    Py_VISIT(b->slots);
    Py_VISIT(b->inside);
    Py_VISIT(b->checker);
    Py_VISIT(b->recorder);
    Py_VISIT(b->wait_long);
    Py_VISIT(b->pending);
    Py_VISIT(b->mpi_error);
    Py_VISIT(b->later);
    Py_VISIT(b->handle);
    return 0;
}

static int CallBooks_clear(CallBooks *b)
{
    Py_CLEAR(b->checker);
    Py_CLEAR(b->wait_long);
    Py_CLEAR(b->pending);
    Py_CLEAR(b->mpi_error);
    Py_CLEAR(b->later);
    Py_CLEAR(b->handle);
    Py_CLEAR(b->recorder);
    return 0;
}

static void CallBooks_dealloc(CallBooks *b)
{
    PyObject_GC_UnTrack(b);
    CallBooks_clear(b);
    if (b->slot_word != NULL)
        PyBuffer_Release(&b->slots_view);
    if (b->inside_word != NULL)
        PyBuffer_Release(&b->inside_view);
    Py_CLEAR(b->slots);
    Py_CLEAR(b->inside);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

/* ------------------------------------------------------------------ numbering, entries */

/* CallBooks.number: the call's seq, or -1 with an error set. */
static long long number(CallBooks *b, PyObject *call, int p2p, PyObject *array, PyObject *name,
                        PyObject *op, PyObject *root)
{
    long long seq = ++b->seq;
    if (p2p) {
        b->p2p++;
        return seq;
    }
    long long nth = seq - b->p2p;
    if (b->slot_word != NULL)
        *b->slot_word = nth;
    if (b->checker != Py_None) {
        double t = now(), last = b->last_call;
        b->last_call = t;
        if (nth >= b->next_check || t - last > b->quiet) {
            PyObject *n = PyLong_FromLongLong(nth);
            PyObject *r = n == NULL ? NULL
                                    : PyObject_CallMethodObjArgs(b->checker, s_verify, n, call,
                                                                 array, name, op, root, NULL);
            Py_XDECREF(n);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
        }
    }
    return seq;
}

/* CallBooks.begin: number() and an Entry appended to the recorder (new reference). */
static PyObject *begin(CallBooks *b, PyObject *call, int p2p, PyObject *array, PyObject *name,
                       PyObject *op, PyObject *root)
{
    long long seq = number(b, call, p2p, array, name, op, root);
    if (seq < 0)
        return NULL;
    PyObject *shape = array == Py_None ? (Py_INCREF(Py_None), Py_None)
                                       : PyObject_GetAttr(array, s_shape);
    if (shape == NULL)
        return NULL;
    PyObject *entry = new_entry(seq, call, shape, name);
    Py_DECREF(shape);
    if (entry == NULL)
        return NULL;
    PyObject *r = PyObject_CallMethodOneArg(b->recorder, s_append, entry);
    if (r == NULL) {
        Py_DECREF(entry);
        return NULL;
    }
    Py_DECREF(r);
    return entry;
}

static int is_p2p(PyObject *call)
{
    return point_to_point == NULL ? 0 : PySet_Contains(point_to_point, call);
}

static PyObject *CallBooks_take(CallBooks *b, PyObject *call)
{
    if (b->busy) {
        PyObject *text = PyUnicode_FromFormat("%S: %S", call, in_use_text);
        if (text != NULL) {
            PyErr_SetObject(in_use_error, text);
            Py_DECREF(text);
        }
        return NULL;
    }
    b->busy = 1;
    Py_RETURN_NONE;
}

static PyObject *CallBooks_give(CallBooks *b, PyObject *unused)
{
    (void)unused;
    b->busy = 0;
    Py_RETURN_NONE;
}

static PyObject *CallBooks_forget_board(CallBooks *b, PyObject *unused)
{
    (void)unused;
    if (hold_word(Py_None, 0, &b->slots_view, &b->slot_word, &b->slots) < 0 ||
        hold_word(Py_None, 0, &b->inside_view, &b->inside_word, &b->inside) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *CallBooks_number(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "number(call, array, name, op, root)");
        return NULL;
    }
    int p2p = is_p2p(args[0]);
    long long seq = p2p < 0 ? -1 : number(b, args[0], p2p, args[1], args[2], args[3], args[4]);
    return seq < 0 ? NULL : PyLong_FromLongLong(seq);
}

static PyObject *CallBooks_begin(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "begin(call, array, name, op, root)");
        return NULL;
    }
    int p2p = is_p2p(args[0]);
    return p2p < 0 ? NULL : begin(b, args[0], p2p, args[1], args[2], args[3], args[4]);
}

/* ------------------------------------------------------------------------ one call, run */

/* One checked direct-path call (the arguments of run()). */
typedef struct {
    int kind;
    PyObject *array, *name, *op, *root; /* for the books: what check mode compares */
    PyObject *result, *send, *recv;     /* send, recv: arrays, or None */
    long long count;
    PyObject *datatype, *mpi_op; /* handles (C primitives) or mpi4py objects */
    int root_rank, async_op;
} Call;

/* A handle as mpi4py gives it (None: a call that takes none, e.g. a broadcast's op). */
static unsigned long long handle_of(PyObject *value, int *failed)
{
    *failed = 0;
    if (value == Py_None)
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLongMask(value);
    *failed = v == (unsigned long long)-1 && PyErr_Occurred();
    return v;
}

/* The request as Python sees it: the handle (C primitives), or mpi4py's request. */
static PyObject *post(CallBooks *b, const Call *c, int blocking, unsigned long long *request)
{
    if (primitives == NULL) {
        PyObject *args[9] = {NULL};
        PyObject *r = NULL;
        args[0] = PyLong_FromLong(c->kind);
        args[5] = PyLong_FromLongLong(c->count);
        args[8] = PyLong_FromLong(c->root_rank);
        if (args[0] && args[5] && args[8]) {
            args[1] = blocking ? Py_True : Py_False;
            args[2] = b->handle;
            args[3] = c->send;
            args[4] = c->recv;
            args[6] = c->datatype;
            args[7] = c->mpi_op;
            r = PyObject_Vectorcall(py_post, args, 9, NULL);
        }
        Py_XDECREF(args[0]);
        Py_XDECREF(args[5]);
        Py_XDECREF(args[8]);
        *request = r == Py_None ? 0 : 1;
        return r;
    }
    int failed[3];
    unsigned long long comm = handle_of(b->handle, &failed[0]);
    unsigned long long datatype = handle_of(c->datatype, &failed[1]);
    unsigned long long op = handle_of(c->mpi_op, &failed[2]);
    if (failed[0] || failed[1] || failed[2])
        return NULL;
    Py_buffer sv = {0}, rv = {0};
    if (c->send != Py_None && PyObject_GetBuffer(c->send, &sv, PyBUF_SIMPLE) < 0)
        return NULL;
    /* a broadcast's buffer is only read on the root: its caller checked the others' */
    if (c->recv != Py_None &&
        PyObject_GetBuffer(c->recv, &rv, c->kind == BROADCAST ? PyBUF_SIMPLE : PyBUF_WRITABLE) <
            0) {
        if (sv.obj != NULL)
            PyBuffer_Release(&sv);
        return NULL;
    }
    int rc;
    if (blocking) {
        Py_BEGIN_ALLOW_THREADS
        rc = primitives->post(c->kind, 1, comm, sv.buf, rv.buf, c->count, datatype, op,
                              c->root_rank, request);
        Py_END_ALLOW_THREADS
    } else {
        rc = primitives->post(c->kind, 0, comm, sv.buf, rv.buf, c->count, datatype, op,
                              c->root_rank, request);
    }
    if (sv.obj != NULL)
        PyBuffer_Release(&sv);
    if (rv.obj != NULL)
        PyBuffer_Release(&rv);
    if (rc != 0) {
        PyObject *code = PyLong_FromLong(rc);
        if (code != NULL) {
            PyErr_SetObject(mpi_exception, code);
            Py_DECREF(code);
        }
        return NULL;
    }
    if (blocking)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(*request);
}

/* Polls the request for yield_after: 1 done, 0 not yet, -1 an error set. */
static int poll(CallBooks *b, PyObject **request_obj, unsigned long long *request)
{
    if (primitives == NULL) {
        PyObject *y = PyFloat_FromDouble(b->yield_after);
        PyObject *r = y == NULL ? NULL : PyObject_CallFunctionObjArgs(py_poll, *request_obj, y, NULL);
        Py_XDECREF(y);
        if (r == NULL)
            return -1;
        int done = PyObject_IsTrue(r);
        Py_DECREF(r);
        return done;
    }
    int rc, done = 0;
    double yield_after = b->yield_after;
    Py_BEGIN_ALLOW_THREADS
    rc = primitives->poll(request, yield_after, &done);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyObject *code = PyLong_FromLong(rc);
        if (code != NULL) {
            PyErr_SetObject(mpi_exception, code);
            Py_DECREF(code);
        }
        return -1;
    }
    if (!done) { /* the request as MPI_Test left it, for the wait that goes on */
        PyObject *fresh = PyLong_FromUnsignedLongLong(*request);
        if (fresh == NULL)
            return -1;
        Py_SETREF(*request_obj, fresh);
    }
    return done;
}

/* Steps 2 to 5 of _books.py once the token is taken: the result (new reference), or NULL. */
static PyObject *post_and_wait(CallBooks *b, const Call *c, PyObject *call)
{
    PyObject *entry = begin(b, call, c->kind == SEND || c->kind == RECV, c->array, c->name,
                            c->op, c->root);
    if (entry == NULL)
        return NULL;
    int later = c->async_op || b->grouped;
    /* point-to-point calls are never blocking: a rank may send before it receives */
    int blocking = b->blocking && c->kind != SEND && c->kind != RECV && !later;
    /* A blocking call cannot post anything once begun: the board says beforehand that this
     * rank is inside it (nth * 16 + code, as _progress.BLOCKING_CALLS), and 0 once it returns */
    long long *inside = blocking ? b->inside_word : NULL;
    if (inside != NULL)
        *inside = (((Entry *)entry)->seq - b->p2p) * 16 + c->kind + 1;
    unsigned long long request = 0;
    PyObject *request_obj = post(b, c, blocking, &request);
    if (inside != NULL)
        *inside = 0;
    PyObject *result = NULL;
    if (request_obj == NULL) { /* posting failed: nothing is in flight to record */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *r = PyObject_CallMethodNoArgs(b->recorder, s_pop);
        Py_XDECREF(r);
        PyErr_Clear();
        PyErr_Restore(type, value, traceback);
        goto done;
    }
    PyObject *arrays = PyTuple_Pack(2, c->send, c->recv);
    if (arrays == NULL)
        goto done;
    if (later) {
        PyObject *async_flag = c->async_op ? Py_True : Py_False;
        result = PyObject_CallFunctionObjArgs(b->later, request_obj, entry, arrays, c->result,
                                              async_flag, NULL);
    } else {
        /* polling failed: the call was posted, so its entry stays, never completed */
        int done = request_obj == Py_None ? 1 : poll(b, &request_obj, &request);
        if (done == 0) {
            PyObject *r = PyObject_CallFunctionObjArgs(b->wait_long, request_obj, entry, arrays,
                                                       NULL);
            done = r == NULL ? -1 : 1;
            Py_XDECREF(r);
        }
        if (done > 0) {
            ((Entry *)entry)->end = now();
            Py_INCREF(c->result);
            result = c->result;
        }
    }
    Py_DECREF(arrays);
done:
    Py_XDECREF(request_obj);
    Py_DECREF(entry);
    return result;
}

/* The thread guards around post_and_wait; an MPI error is handed to books.mpi_error once
 * the token is back (the communicator dies of it). NotImplemented: not the owner thread, or
 * the token is taken: the general path refuses the call, or says so. */
static PyObject *run(CallBooks *b, const Call *c)
{
    if (b->owner != PyThread_get_thread_ident() || b->busy)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *call = PyTuple_GET_ITEM(kind_names, c->kind);
    b->busy = 1;
    PyObject *result = post_and_wait(b, c, call);
    b->busy = 0;
    if (result == NULL && PyErr_ExceptionMatches(mpi_exception)) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        if (traceback != NULL)
            PyException_SetTraceback(value, traceback);
        PyObject *r = PyObject_CallFunctionObjArgs(b->mpi_error, call, value, NULL);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return r; /* it raises: NULL */
    }
    return result;
}

/* run(kind, array, name, op, root, result, send, recv, count, datatype, mpi_op, async_op) */
static PyObject *CallBooks_run(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "run takes 12 arguments");
        return NULL;
    }
    Call c = {0};
    c.kind = PyLong_AsLong(args[0]);
    c.array = args[1];
    c.name = args[2];
    c.op = args[3];
    c.root = args[4];
    c.root_rank = args[4] == Py_None ? 0 : PyLong_AsLong(args[4]);
    c.result = args[5];
    c.send = args[6];
    c.recv = args[7];
    c.count = PyLong_AsLongLong(args[8]);
    c.datatype = args[9];
    c.mpi_op = args[10];
    c.async_op = PyObject_IsTrue(args[11]);
    if (PyErr_Occurred())
        return NULL;
    if (c.kind < 0 || c.kind >= KINDS || c.count < 0) {
        PyErr_SetString(PyExc_ValueError, "run: no such kind, or a negative count");
        return NULL;
    }
    if (primitives != NULL && c.count > primitives->count_max)
        Py_RETURN_NOTIMPLEMENTED; /* a count this ABI's calls cannot take: the general path's */
    return run(b, &c);
}

/* ------------------------------------------- the two busiest verbs, their checks in C */

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

static long long elements(const Py_buffer *view)
{
    return (long long)(view->len / (view->itemsize ? view->itemsize : 1));
}

/* all_reduce(x, op, out, async_op): _direct.all_reduce, the result or NotImplemented */
static PyObject *CallBooks_all_reduce(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "all_reduce(x, op, out, async_op)");
        return NULL;
    }
    PyObject *x = args[0], *op = args[1], *out = args[2];
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
    int fits = 1;
    if (!in_place) {
        if (!take_buffer(out, &ob, 1)) {
            PyBuffer_Release(&xb);
            Py_RETURN_NOTIMPLEMENTED;
        }
        fits = same_shape(&xb, &ob) && apart(&xb, &ob); /* the general path judges overlap */
        PyBuffer_Release(&ob);
    }
    long long count = elements(&xb);
    PyBuffer_Release(&xb);
    if (!fits || count > 2147483647LL)
        Py_RETURN_NOTIMPLEMENTED; /* (a count above what one call takes: the general path's) */
    /* the table entries are held: check mode and the recorder run Python in between */
    Py_INCREF(types);
    Py_INCREF(ops);
    Call c = {ALL_REDUCE, x, PyTuple_GET_ITEM(types, 0), PyTuple_GET_ITEM(ops, 0), Py_None,
              in_place ? x : out, in_place ? Py_None : x, in_place ? x : out, count,
              PyTuple_GET_ITEM(types, 1), PyTuple_GET_ITEM(ops, 1), 0, 0};
    c.async_op = PyObject_IsTrue(args[3]);
    PyObject *result = c.async_op < 0 ? NULL : run(b, &c);
    Py_DECREF(types);
    Py_DECREF(ops);
    return result;
}

/* broadcast(x, root, async_op): _direct.broadcast, x or NotImplemented */
static PyObject *CallBooks_broadcast(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "broadcast(x, root, async_op)");
        return NULL;
    }
    PyObject *x = args[0], *root = args[1];
    if ((PyObject *)Py_TYPE(x) != ndarray || !PyLong_CheckExact(root))
        Py_RETURN_NOTIMPLEMENTED;
    int overflow;
    long long root_rank = PyLong_AsLongLongAndOverflow(root, &overflow);
    if (overflow || root_rank < 0 || root_rank >= b->size)
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
    if (!take_buffer(x, &xb, root_rank != b->rank)) /* the root only reads x */
        Py_RETURN_NOTIMPLEMENTED;
    long long count = elements(&xb);
    PyBuffer_Release(&xb);
    if (count > 2147483647LL)
        Py_RETURN_NOTIMPLEMENTED;
    Py_INCREF(types);
    Call c = {BROADCAST, x, PyTuple_GET_ITEM(types, 0), Py_None, root, x, Py_None, x, count,
              PyTuple_GET_ITEM(types, 1), Py_None, (int)root_rank, 0};
    c.async_op = PyObject_IsTrue(args[2]);
    PyObject *result = c.async_op < 0 ? NULL : run(b, &c);
    Py_DECREF(types);
    return result;
}

/* ------------------------------------------------------------------ the type's members */

static PyObject *get_slots(CallBooks *b, void *unused)
{
    (void)unused;
    Py_INCREF(b->slots);
    return b->slots;
}

static PyObject *get_inside(CallBooks *b, void *unused)
{
    (void)unused;
    Py_INCREF(b->inside);
    return b->inside;
}

static PyObject *get_busy(CallBooks *b, void *unused)
{
    (void)unused;
    return PyBool_FromLong(b->busy);
}

static PyGetSetDef books_getset[] = {
    {"slots", (getter)get_slots, NULL, "the progress board's words (int64)", NULL},
    {"inside", (getter)get_inside, NULL, "the board's inside words, or None", NULL},
    {"busy", (getter)get_busy, NULL, "whether a call holds the communicator (the token)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define M(name, type, flags, doc) {#name, type, offsetof(CallBooks, name), flags, doc}
static PyMemberDef books_members[] = {
    M(seq, T_LONGLONG, 0, "calls made so far"),
    M(p2p, T_LONGLONG, 0, "how many of them were point-to-point"),
    M(slot, T_PYSSIZET, READONLY, "this rank's index on the progress board"),
    M(rank, T_INT, READONLY, "this rank"),
    M(size, T_INT, READONLY, "the communicator's size"),
    M(next_check, T_LONGLONG, 0, "the collective number check mode verifies next"),
    M(last_call, T_DOUBLE, 0, "monotonic time of the last collective"),
    M(quiet, T_DOUBLE, 0, "seconds of quiet after which check mode verifies"),
    M(yield_after, T_DOUBLE, 0, "seconds of polling before a waiting rank yields its core"),
    M(owner, T_ULONG, 0, "the owner thread's ident (0: none known yet)"),
    M(grouped, T_BOOL, 0, "inside Communicator.group(): calls are held until it ends"),
    M(blocking, T_BOOL, 0, "synchronous collectives are blocking MPI calls"),
    M(checker, T_OBJECT, 0, "check mode's Guard, or None"),
    M(recorder, T_OBJECT, READONLY, "the flight recorder: the last calls"),
    M(wait_long, T_OBJECT, 0, "wait_long(request, entry, arrays): the rest of a long wait"),
    M(pending, T_OBJECT, 0, "pending(request, entry, arrays): the backend's Pending"),
    M(mpi_error, T_OBJECT, 0, "mpi_error(call, error): raises it as the front end's error"),
    M(later, T_OBJECT, 0, "later(request, entry, arrays, result, async_op)"),
    M(handle, T_OBJECT, 0, "the direct path's MPI communicator, as the primitives take it"),
    {NULL, 0, 0, 0, NULL},
};
#undef M

static PyMethodDef books_methods[] = {
    {"take", (PyCFunction)CallBooks_take, METH_O,
     "take(call): take the token, or raise CommunicatorStateError naming call"},
    {"give", (PyCFunction)CallBooks_give, METH_NOARGS, "give(): give the token back"},
    {"forget_board", (PyCFunction)CallBooks_forget_board, METH_NOARGS,
     "forget_board(): let go of the progress board (before it is closed)"},
    {"number", (PyCFunction)(void (*)(void))CallBooks_number, METH_FASTCALL,
     "number(call, array, name, op, root) -> seq: number one call (check mode may verify)"},
    {"begin", (PyCFunction)(void (*)(void))CallBooks_begin, METH_FASTCALL,
     "begin(call, array, name, op, root) -> Entry: number() and a recorder entry"},
    {"run", (PyCFunction)(void (*)(void))CallBooks_run, METH_FASTCALL,
     "run(kind, array, name, op, root, result, send, recv, count, datatype, mpi_op, async_op)"
     " -> result, its Work, or NotImplemented"},
    {"all_reduce", (PyCFunction)(void (*)(void))CallBooks_all_reduce, METH_FASTCALL,
     "all_reduce(x, op, out, async_op) -> the result, its Work, or NotImplemented"},
    {"broadcast", (PyCFunction)(void (*)(void))CallBooks_broadcast, METH_FASTCALL,
     "broadcast(x, root, async_op) -> x, its Work, or NotImplemented"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CallBooksType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives._callbooks.CallBooks",
    .tp_basicsize = sizeof(CallBooks),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "CallBooks(slots, slot, recorder_length, yield_after, wait_long, rank, size, "
              "inside=None): the per-call state of one communicator (see _books.py)",
    .tp_new = CallBooks_new,
    .tp_init = (initproc)CallBooks_init,
    .tp_dealloc = (destructor)CallBooks_dealloc,
    .tp_traverse = (traverseproc)CallBooks_traverse,
    .tp_clear = (inquiry)CallBooks_clear,
    .tp_members = books_members,
    .tp_getset = books_getset,
    .tp_methods = books_methods,
};

/* ------------------------------------------------------------------------ the module */

/* configure(point_to_point, in_use_error, in_use_text, mpi_exception): _books.py's */
static PyObject *configure(PyObject *self, PyObject *args)
{
    PyObject *objects[4];
    PyObject **slots[4] = {&point_to_point, &in_use_error, &in_use_text, &mpi_exception};
    (void)self;
    if (!PyArg_ParseTuple(args, "O!OUO", &PyFrozenSet_Type, &objects[0], &objects[1],
                          &objects[2], &objects[3]))
        return NULL;
    for (int i = 0; i < 4; i++) {
        Py_INCREF(objects[i]);
        Py_XSETREF(*slots[i], objects[i]);
    }
    Py_RETURN_NONE;
}

/* use_primitives(capsule or None, py_post, py_poll, kinds, ndarray, fast_type, fast_op,
 * reduce_op): _direct.py's, once */
static PyObject *use_primitives(PyObject *self, PyObject *args)
{
    PyObject *capsule, *objects[7];
    PyObject **slots[7] = {&py_post, &py_poll, &kind_names, &ndarray,
                           &fast_type, &fast_op, &reduce_op};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOO!OO!O!O", &capsule, &objects[0], &objects[1],
                          &PyTuple_Type, &objects[2], &objects[3], &PyDict_Type, &objects[4],
                          &PyDict_Type, &objects[5], &objects[6]))
        return NULL;
    if (PyTuple_GET_SIZE(objects[2]) != KINDS) {
        PyErr_Format(PyExc_ValueError, "use_primitives: %d kinds expected", KINDS);
        return NULL;
    }
    const Primitives *given = NULL;
    if (capsule != Py_None) {
        given = PyCapsule_GetPointer(capsule, PRIMITIVES_CAPSULE);
        if (given == NULL)
            return NULL;
    }
    primitives = given;
    for (int i = 0; i < 7; i++) {
        Py_INCREF(objects[i]);
        Py_XSETREF(*slots[i], objects[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(point_to_point, in_use_error, in_use_text, mpi_exception)"},
    {"use_primitives", use_primitives, METH_VARARGS,
     "use_primitives(capsule, py_post, py_poll, kinds, ndarray, fast_type, fast_op, "
     "reduce_op)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "collectives._callbooks", NULL, -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__callbooks(void)
{
    struct {
        PyObject **name;
        const char *text;
    } names[] = {{&s_append, "append"}, {&s_pop, "pop"},     {&s_verify, "verify"},
                 {&s_shape, "shape"},   {&s_dtype, "dtype"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].name = PyUnicode_InternFromString(names[i].text);
        if (*names[i].name == NULL)
            return NULL;
    }
    if (PyType_Ready(&EntryType) < 0 || PyType_Ready(&CallBooksType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&EntryType);
    Py_INCREF(&CallBooksType);
    if (PyModule_AddObject(m, "Entry", (PyObject *)&EntryType) < 0 ||
        PyModule_AddObject(m, "CallBooks", (PyObject *)&CallBooksType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
