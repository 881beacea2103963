/* The direct path's verbs: each checks its arguments as the direct path takes them (NumPy
 * arrays, C-contiguous, of a dtype and op MPI has, apart or exactly in place), then hands the
 * call to run() (_callbooks_run.c). Anything else gives NotImplemented before any
 * bookkeeping: the general path (Communicator) runs the call or names the error. Part of
 * collectives._callbooks. */
#include "_callbooks.h"

/* ------------------------------------------------------------- what the verbs share */

static int apart(const Py_buffer *a, const Py_buffer *b)
{
    const char *a0 = a->buf, *b0 = b->buf;
    return a->len == 0 || b->len == 0 || a0 + a->len <= b0 || b0 + b->len <= a0;
}

static long long elements(const Py_buffer *view)
{
    return (long long)(view->len / (view->itemsize ? view->itemsize : 1));
}

/* An array as the direct path takes it: a C-contiguous NumPy array of at most LARGE
 * elements, its buffer held (writable where asked) and its dtype. */
typedef struct {
    PyObject *obj, *dtype;
    Py_buffer v;
} Arr;

/* elements above which a call is the general path's, in parts: Open MPI 5's calls take int
 * counts (it has no large-count ones), and one bound serves both ABIs */
#define LARGE 2147483647LL

static void arr_free(Arr *a)
{
    if (a->obj != NULL)
        PyBuffer_Release(&a->v);
    a->obj = NULL;
    Py_CLEAR(a->dtype);
}

/* 1 taken, 0 not for the direct path (nothing held, no error), -1 an error set. */
static int arr_take(PyObject *obj, int writable, Arr *a)
{
    a->obj = a->dtype = NULL;
    if ((PyObject *)Py_TYPE(obj) != ndarray)
        return 0;
    if (PyObject_GetBuffer(obj, &a->v, PyBUF_ND | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear(); /* not ours to judge: the general path names what is wrong */
        return 0;
    }
    a->obj = obj;
    a->dtype = PyObject_GetAttr(obj, s_dtype);
    if (a->dtype == NULL) {
        arr_free(a);
        return -1;
    }
    if (elements(&a->v) > LARGE || a->v.ndim >= 63) {
        arr_free(a);
        return 0;
    }
    return 1;
}

/* FAST_TYPE's (name, datatype) of a's dtype (borrowed), or NULL (an error set, or not).
 * The last dtype found is kept with its entry: hashing a NumPy dtype costs more than the
 * rest of the lookup, and a program calls with few dtypes (the cache holds a reference, so
 * that no other dtype can come to have its address). */
static PyObject *arr_types(const Arr *a)
{
    static PyObject *last_dtype, *last_types, *last_table;
    if (a->dtype == last_dtype && fast_type == last_table)
        return last_types;
    PyObject *types = PyDict_GetItemWithError(fast_type, a->dtype);
    if (types != NULL) { /* all three set before any is let go (which may run code) */
        PyObject *old[3] = {last_dtype, last_types, last_table};
        Py_INCREF(a->dtype);
        Py_INCREF(types);
        Py_INCREF(fast_type);
        last_dtype = a->dtype;
        last_types = types;
        last_table = fast_type;
        for (int i = 0; i < 3; i++)
            Py_XDECREF(old[i]);
    }
    return types;
}

/* Whether out has like's dtype and the shape dims[:ndim] (out taken writable). */
static int made(const Arr *out, const Arr *like, int ndim, const Py_ssize_t *dims)
{
    return out->dtype == like->dtype && out->v.ndim == ndim &&
           (ndim == 0 || memcmp(out->v.shape, dims, ndim * sizeof(Py_ssize_t)) == 0);
}

/* Whether part is exactly whole[index] (the in-place forms of gather and scatter). */
static int is_slot(const Arr *part, const Arr *whole, Py_ssize_t index)
{
    return part->v.len > 0 && whole->v.ndim > 0 &&
           part->v.len * whole->v.shape[0] == whole->v.len &&
           (char *)part->v.buf == (char *)whole->v.buf + index * part->v.len;
}

/* A new array of `shape` (dims[:ndim]) and `dtype`, or NULL with an error set. */
static PyObject *new_array(int ndim, const Py_ssize_t *dims, PyObject *dtype)
{
    PyObject *shape = PyTuple_New(ndim);
    if (shape == NULL)
        return NULL;
    for (int i = 0; i < ndim; i++) {
        PyObject *n = PyLong_FromSsize_t(dims[i]);
        if (n == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, i, n);
    }
    PyObject *array = PyObject_CallFunctionObjArgs(empty, shape, dtype, NULL);
    Py_DECREF(shape);
    return array;
}

/* A root or peer in range (and not this rank where asked), else -1. */
static int rank_of(CallBooks *b, PyObject *value, int not_mine)
{
    if (!PyLong_CheckExact(value))
        return -1;
    int overflow;
    long long r = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || r < 0 || r >= b->size || (not_mine && r == b->rank))
        return -1;
    return (int)r;
}

/* FAST_OP's (ReduceOp, op) of `op` (borrowed), or NULL (an error set, or not ours). */
static PyObject *op_of(PyObject *op)
{
    if (!(PyUnicode_CheckExact(op) || (PyObject *)Py_TYPE(op) == reduce_op))
        return NULL;
    return PyDict_GetItemWithError(fast_op, op);
}

static int check_nargs(const char *form, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s", form);
    return -1;
}

/* A Call of `kind` on `array` (`types`: FAST_TYPE's (name, datatype), or NULL: none) that
 * gives `result`: no op, root, send or recv until the verb sets them. */
static Call new_call(int kind, PyObject *array, PyObject *types, PyObject *result)
{
    Call c = {
        .kind = kind,
        .array = array,
        .name = types == NULL ? Py_None : PyTuple_GET_ITEM(types, 0),
        .op = Py_None,
        .root = Py_None,
        .result = result,
        .send = Py_None,
        .recv = Py_None,
        .datatype = types == NULL ? Py_None : PyTuple_GET_ITEM(types, 1),
        .mpi_op = Py_None,
        .source_rank = -1,
    };
    return c;
}

/* The call's op, FAST_OP's (ReduceOp, op handle). */
static void set_op(Call *c, PyObject *ops)
{
    c->op = PyTuple_GET_ITEM(ops, 0);
    c->mpi_op = PyTuple_GET_ITEM(ops, 1);
}

/* The call's root or peer: as given (for the books), and as a rank. */
static void set_root(Call *c, PyObject *given, int rank)
{
    c->root = given;
    c->root_rank = rank;
}

/* The end of every verb below: NotImplemented where `fits` is 0, the call's result where
 * 1, NULL where an error is set; the arrays are let go. */
#define NOT_OURS ((PyObject *)-1)

static PyObject *finish(PyObject *result, Arr *a, Arr *o)
{
    arr_free(a);
    arr_free(o);
    if (result == NOT_OURS)
        Py_RETURN_NOTIMPLEMENTED;
    return result;
}

/* The memory of `obj` where it is one of the arrays taken, else NULL. */
static void *memory_of(PyObject *obj, const Arr *a, const Arr *o)
{
    if (obj == Py_None)
        return NULL;
    return a->obj == obj ? a->v.buf : o->obj == obj ? o->v.buf : NULL;
}

/* The end of every verb that took its arrays: the call runs on their memory (as taken:
 * writable where it writes), async_op read from `flag`; then the arrays are let go (the call
 * holds them), and `made_out`, an array made here. */
static PyObject *run_checked(CallBooks *b, Call *c, PyObject *flag, Arr *a, Arr *o,
                             PyObject *made_out)
{
    c->async_op = PyObject_IsTrue(flag);
    if (c->send_at == NULL)
        c->send_at = memory_of(c->send, a, o);
    if (c->recv_at == NULL)
        c->recv_at = memory_of(c->recv, a, o);
    c->array_view = a->obj != NULL && c->array == a->obj   ? &a->v
                    : o->obj != NULL && c->array == o->obj ? &o->v
                                                           : NULL;
    PyObject *result = c->async_op < 0 ? NULL : run(b, c);
    arr_free(o);
    arr_free(a);
    Py_XDECREF(made_out);
    return result;
}

/* all_reduce(x, op, out, async_op) */
PyObject *CallBooks_all_reduce(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("all_reduce(x, op, out, async_op)", nargs, 4) < 0)
        return NULL;
    PyObject *x = args[0], *out = args[2];
    Arr a = {0}, o = {0};
    PyObject *ops = op_of(args[1]);
    if (ops == NULL)
        return PyErr_Occurred() ? NULL : finish(NOT_OURS, &a, &o);
    int in_place = out == Py_None || out == x;
    int got = arr_take(x, in_place, &a);
    PyObject *types = got > 0 ? arr_types(&a) : NULL;
    if (types == NULL)
        return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
    if (!in_place) { /* a twin apart from x (the general path judges overlap) */
        got = arr_take(out, 1, &o);
        if (got <= 0 || !made(&o, &a, a.v.ndim, a.v.shape) || !apart(&a.v, &o.v))
            return finish(got < 0 ? NULL : NOT_OURS, &a, &o);
    }
    PyObject *result = in_place ? x : out;
    Call c = new_call(ALL_REDUCE, x, types, result);
    set_op(&c, ops);
    c.send = in_place ? Py_None : x;
    c.recv = result;
    c.count = elements(&a.v);
    return run_checked(b, &c, args[3], &a, &o, NULL);
}

/* broadcast(x, root, async_op) */
PyObject *CallBooks_broadcast(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("broadcast(x, root, async_op)", nargs, 3) < 0)
        return NULL;
    PyObject *x = args[0];
    Arr a = {0}, o = {0};
    int root = rank_of(b, args[1], 0);
    int got = root < 0 ? 0 : arr_take(x, root != b->rank, &a); /* the root only reads x */
    PyObject *types = got > 0 ? arr_types(&a) : NULL;
    if (types == NULL)
        return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
    Call c = new_call(BROADCAST, x, types, x);
    set_root(&c, args[1], root);
    c.recv = x;
    c.count = elements(&a.v);
    return run_checked(b, &c, args[2], &a, &o, NULL);
}

/* reduce(x, root, op, out, async_op) */
PyObject *CallBooks_reduce(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("reduce(x, root, op, out, async_op)", nargs, 5) < 0)
        return NULL;
    PyObject *x = args[0], *out = args[3];
    Arr a = {0}, o = {0};
    int root = rank_of(b, args[1], 0);
    PyObject *ops = root < 0 ? NULL : op_of(args[2]);
    if (ops == NULL)
        return PyErr_Occurred() ? NULL : finish(NOT_OURS, &a, &o);
    int mine = root == b->rank, in_place = out == Py_None || out == x;
    int got = arr_take(x, mine && in_place, &a);
    PyObject *types = got > 0 ? arr_types(&a) : NULL;
    if (types == NULL)
        return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
    if (!in_place) { /* a twin apart from x (looked at and then ignored on other ranks) */
        got = arr_take(out, 1, &o);
        if (got <= 0 || !made(&o, &a, a.v.ndim, a.v.shape) || !apart(&a.v, &o.v))
            return finish(got < 0 ? NULL : NOT_OURS, &a, &o);
    }
    PyObject *send = mine && in_place ? Py_None : x;
    PyObject *result = !mine ? Py_None : in_place ? x : out;
    Call c = new_call(REDUCE, x, types, mine ? result : x);
    set_op(&c, ops);
    set_root(&c, args[1], root);
    c.send = send;
    c.recv = result;
    c.count = elements(&a.v);
    return run_checked(b, &c, args[4], &a, &o, NULL);
}

/* all_gather(x, out, async_op) */
PyObject *CallBooks_all_gather(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("all_gather(x, out, async_op)", nargs, 3) < 0)
        return NULL;
    PyObject *x = args[0], *out = args[1], *made_out = NULL, *send = x;
    Arr a = {0}, o = {0};
    int got = arr_take(x, 0, &a);
    PyObject *types = got > 0 ? arr_types(&a) : NULL;
    if (types == NULL)
        return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
    Py_ssize_t dims[64];
    dims[0] = b->size;
    if (a.v.ndim > 0)
        memcpy(dims + 1, a.v.shape, a.v.ndim * sizeof(Py_ssize_t));
    if (out == Py_None) {
        out = made_out = new_array(a.v.ndim + 1, dims, a.dtype);
        if (out == NULL)
            return finish(NULL, &a, &o);
    } else {
        got = arr_take(out, 1, &o);
        if (got <= 0 || !made(&o, &a, a.v.ndim + 1, dims))
            return finish(got < 0 ? NULL : NOT_OURS, &a, &o);
        if (is_slot(&a, &o, b->rank))
            send = Py_None;
        else if (!apart(&a.v, &o.v))
            return finish(NOT_OURS, &a, &o);
    }
    Call c = new_call(ALL_GATHER, x, types, out);
    c.send = send;
    c.recv = out;
    c.count = elements(&a.v);
    return run_checked(b, &c, args[2], &a, &o, made_out);
}

/* reduce_scatter(x, op, out, async_op) */
PyObject *CallBooks_reduce_scatter(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("reduce_scatter(x, op, out, async_op)", nargs, 4) < 0)
        return NULL;
    PyObject *x = args[0], *out = args[2], *made_out = NULL;
    Arr a = {0}, o = {0};
    PyObject *ops = op_of(args[1]);
    if (ops == NULL)
        return PyErr_Occurred() ? NULL : finish(NOT_OURS, &a, &o);
    int got = arr_take(x, 0, &a);
    PyObject *types = got > 0 ? arr_types(&a) : NULL;
    if (types == NULL || a.v.ndim == 0 || a.v.shape[0] != b->size)
        return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
    Py_ssize_t part = a.v.len / b->size;
    int exchange = b->size == 2 && exchanges && part > b->kept_bytes; /* (_direct.EXCHANGES) */
    int in_place = 0;
    if (out == Py_None) { /* (an exchange reduces into it: its memory is taken) */
        out = made_out = new_array(a.v.ndim - 1, a.v.shape + 1, a.dtype);
        if (out == NULL || (exchange && arr_take(out, 1, &o) <= 0)) {
            Py_XDECREF(made_out);
            return finish(PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
        }
    } else {
        got = arr_take(out, 1, &o);
        if (got <= 0 || !made(&o, &a, a.v.ndim - 1, a.v.shape + 1))
            return finish(got < 0 ? NULL : NOT_OURS, &a, &o);
        in_place = is_slot(&o, &a, b->rank);
        if (!in_place && !apart(&a.v, &o.v))
            return finish(NOT_OURS, &a, &o);
    }
    Call c = new_call(REDUCE_SCATTER, x, types, out);
    set_op(&c, ops);
    c.send = x;
    c.recv = out;
    c.count = elements(&a.v) / b->size;
    c.counted = part >= counted_from;
    if (in_place) {
        /* MPI's in-place form leaves the result in x[0], not x[rank], and MPI cannot reduce
         * into part of its own send buffer: the result (an exchange's: the peer's part) goes
         * to the books' scratch, and from there to x[rank] once complete */
        if ((made_out = scratch(b, part)) == NULL)
            return finish(NULL, &a, &o);
        c.recv = made_out;
        c.recv_at = PyByteArray_AS_STRING(made_out);
        c.copy = (Copy){o.v.buf, c.recv_at, part, made_out};
    }
    if (exchange) {
        /* two ranks: each sends the part the other keeps, then reduces the peer's part of
         * its own into its result: x[rank] into out, or the scratch into x[rank] */
        c.exchange = 1;
        c.root_rank = c.source_rank = 1 - b->rank;
        c.send_at = (char *)a.v.buf + c.root_rank * part;
        if (!in_place)
            c.copy = (Copy){o.v.buf, (char *)a.v.buf + b->rank * part, part, x};
        c.copy.op = c.mpi_op;
        c.copy.datatype = c.datatype;
        c.copy.count = c.count;
    }
    return run_checked(b, &c, args[3], &a, &o, made_out);
}

/* all_to_all(x, out, async_op) */
PyObject *CallBooks_all_to_all(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("all_to_all(x, out, async_op)", nargs, 3) < 0)
        return NULL;
    PyObject *x = args[0], *out = args[1], *made_out = NULL, *send = x;
    Arr a = {0}, o = {0};
    int got = arr_take(x, out == x, &a);
    PyObject *types = got > 0 ? arr_types(&a) : NULL;
    if (types == NULL || a.v.ndim == 0 || a.v.shape[0] != b->size)
        return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
    if (out == Py_None) {
        out = made_out = new_array(a.v.ndim, a.v.shape, a.dtype);
        if (out == NULL)
            return finish(NULL, &a, &o);
    } else if (out == x) {
        send = Py_None;
    } else {
        got = arr_take(out, 1, &o);
        if (got <= 0 || !made(&o, &a, a.v.ndim, a.v.shape) || !apart(&a.v, &o.v))
            return finish(got < 0 ? NULL : NOT_OURS, &a, &o);
    }
    Call c = new_call(ALL_TO_ALL, x, types, out);
    c.send = send;
    c.recv = out;
    c.count = elements(&a.v) / b->size;
    return run_checked(b, &c, args[2], &a, &o, made_out);
}

/* gather(x, root, out, async_op) */
PyObject *CallBooks_gather(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("gather(x, root, out, async_op)", nargs, 4) < 0)
        return NULL;
    PyObject *x = args[0], *out = args[2], *made_out = NULL, *send = x;
    Arr a = {0}, o = {0};
    int root = rank_of(b, args[1], 0);
    int got = root < 0 ? 0 : arr_take(x, 0, &a);
    PyObject *types = got > 0 ? arr_types(&a) : NULL;
    if (types == NULL)
        return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
    Py_ssize_t dims[64];
    dims[0] = b->size;
    if (a.v.ndim > 0)
        memcpy(dims + 1, a.v.shape, a.v.ndim * sizeof(Py_ssize_t));
    if (root != b->rank) {
        out = Py_None; /* not looked at on other ranks */
    } else if (out == Py_None) {
        out = made_out = new_array(a.v.ndim + 1, dims, a.dtype);
        if (out == NULL)
            return finish(NULL, &a, &o);
    } else {
        got = arr_take(out, 1, &o);
        if (got <= 0 || !made(&o, &a, a.v.ndim + 1, dims))
            return finish(got < 0 ? NULL : NOT_OURS, &a, &o);
        if (is_slot(&a, &o, root))
            send = Py_None;
        else if (!apart(&a.v, &o.v))
            return finish(NOT_OURS, &a, &o);
    }
    Call c = new_call(GATHER, x, types, out);
    set_root(&c, args[1], root);
    c.send = send;
    c.recv = out;
    c.count = elements(&a.v);
    return run_checked(b, &c, args[3], &a, &o, made_out);
}

/* scatter(x, root, out, async_op) */
PyObject *CallBooks_scatter(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("scatter(x, root, out, async_op)", nargs, 4) < 0)
        return NULL;
    PyObject *x = args[0], *out = args[2], *made_out = NULL, *types;
    Arr a = {0}, o = {0};
    const Arr *like;
    int ndim, got = 0;
    const Py_ssize_t *dims;
    int root = rank_of(b, args[1], 0), mine = root == b->rank;
    if (root < 0)
        return finish(NOT_OURS, &a, &o);
    if (x != Py_None) {
        got = arr_take(x, 0, &a);
        types = got > 0 ? arr_types(&a) : NULL;
        if (types == NULL || a.v.ndim == 0 || a.v.shape[0] != b->size)
            return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
        like = &a;
        ndim = a.v.ndim - 1;
        dims = a.v.shape + 1;
    } else {
        if (mine || out == Py_None) /* the general path names what is missing */
            return finish(NOT_OURS, &a, &o);
        got = arr_take(out, 1, &o);
        types = got > 0 ? arr_types(&o) : NULL;
        if (types == NULL)
            return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
        like = &o;
        ndim = o.v.ndim;
        dims = o.v.shape;
    }
    PyObject *recv = out;
    if (out == Py_None) {
        out = recv = made_out = new_array(ndim, dims, like->dtype);
        if (out == NULL)
            return finish(NULL, &a, &o);
    } else if (x != Py_None) { /* (where x is None, out was taken above) */
        got = arr_take(out, 1, &o);
        if (got <= 0 || !made(&o, like, ndim, dims))
            return finish(got < 0 ? NULL : NOT_OURS, &a, &o);
        if (is_slot(&o, &a, b->rank))
            recv = mine ? Py_None : out; /* in place on the root */
        else if (!apart(&a.v, &o.v))
            return finish(NOT_OURS, &a, &o);
    }
    long long count = elements(x != Py_None ? &a.v : &o.v) / (x != Py_None ? b->size : 1);
    Call c = new_call(SCATTER, mine ? x : out, types, out);
    set_root(&c, args[1], root);
    c.send = mine ? x : Py_None;
    c.recv = recv;
    c.count = count;
    return run_checked(b, &c, args[3], &a, &o, made_out);
}

/* send or recv: (x, peer, async_op) */
static PyObject *point_to_point_call(CallBooks *b, PyObject *const *args, Py_ssize_t nargs,
                                     int kind)
{
    if (check_nargs(kind == SEND ? "send(x, peer, async_op)" : "recv(x, peer, async_op)",
                    nargs, 3) < 0)
        return NULL;
    PyObject *x = args[0];
    Arr a = {0}, o = {0};
    int peer = rank_of(b, args[1], 1);
    int got = peer < 0 ? 0 : arr_take(x, kind == RECV, &a);
    PyObject *types = got > 0 ? arr_types(&a) : NULL;
    if (types == NULL)
        return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
    Call c = new_call(kind, x, types, kind == SEND ? Py_None : x);
    set_root(&c, args[1], peer);
    if (kind == SEND)
        c.send = x;
    else
        c.recv = x;
    c.count = elements(&a.v);
    return run_checked(b, &c, args[2], &a, &o, NULL);
}

PyObject *CallBooks_send(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    return point_to_point_call(b, args, nargs, SEND);
}

PyObject *CallBooks_recv(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    return point_to_point_call(b, args, nargs, RECV);
}

/* sendrecv(x, peer, out, source, async_op): x sent to peer, out (x's twin, apart from it, or
 * None: a new one) received from source (None: peer); peers other than this rank. */
PyObject *CallBooks_sendrecv(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("sendrecv(x, peer, out, source, async_op)", nargs, 5) < 0)
        return NULL;
    PyObject *x = args[0], *out = args[2], *made_out = NULL;
    PyObject *source_given = args[3] == Py_None ? args[1] : args[3];
    Arr a = {0}, o = {0};
    int peer = sendrecv_posted ? rank_of(b, args[1], 1) : -1;
    int source = peer < 0 ? -1 : rank_of(b, source_given, 1);
    int got = source < 0 ? 0 : arr_take(x, 0, &a);
    PyObject *types = got > 0 ? arr_types(&a) : NULL;
    if (types == NULL)
        return finish(got < 0 || PyErr_Occurred() ? NULL : NOT_OURS, &a, &o);
    if (out == Py_None) {
        out = made_out = new_array(a.v.ndim, a.v.shape, a.dtype);
        if (out == NULL)
            return finish(NULL, &a, &o);
    } else {
        got = arr_take(out, 1, &o);
        if (got <= 0 || !made(&o, &a, a.v.ndim, a.v.shape) || !apart(&a.v, &o.v))
            return finish(got < 0 ? NULL : NOT_OURS, &a, &o);
    }
    Call c = new_call(SENDRECV, x, types, out);
    set_root(&c, args[1], peer);
    c.source_rank = source;
    c.send = x;
    c.recv = out;
    c.count = elements(&a.v);
    return run_checked(b, &c, args[4], &a, &o, made_out);
}

/* barrier(async_op) */
PyObject *CallBooks_barrier(CallBooks *b, PyObject *async_op)
{
    Call c = new_call(BARRIER, Py_None, NULL, Py_None);
    c.async_op = PyObject_IsTrue(async_op);
    return c.async_op < 0 ? NULL : run(b, &c);
}

