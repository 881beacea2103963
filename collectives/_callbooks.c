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
 * `yield_after` goes to the books' `wait_long` (Python, under the timeout: _deadline.py); one
 * made with async_op=True, or inside comm.group(), gives a Work (_callbooks_work.c), which
 * a group holds in `held` until it ends.
 *
 * Each verb of the direct path checks its arguments in C too (CallBooks.all_reduce, ...,
 * _callbooks_verbs.c) and calls run() (_callbooks_run.c); this file has the types and the
 * module. It is ABI-independent and always built; the primitives it calls are handed in by
 * use_primitives() once, at import of _direct.py.
 */
#include "_callbooks.h"

const Primitives *primitives; /* NULL: the mpi4py primitives below */
PyObject *py_post, *py_poll;  /* _direct._py_post and _py_poll */
PyObject *py_reduce_local;    /* _direct._py_reduce_local */
PyObject *mpi_exception;      /* mpi4py's MPI.Exception: made from an error code */
PyObject *point_to_point;     /* _check.POINT_TO_POINT: calls not numbered as collectives */
PyObject *in_use_error;       /* CommunicatorStateError, and the words it says */
PyObject *in_use_text;
PyObject *ndarray;            /* numpy.ndarray */
PyObject *fast_type;          /* _direct.FAST_TYPE: dtype -> (name, datatype handle) */
PyObject *fast_op;            /* _direct.FAST_OP: op -> (ReduceOp, op handle) */
PyObject *reduce_op;          /* the ReduceOp class */
PyObject *empty;              /* numpy.empty */
PyObject *kind_names;         /* _direct.KINDS, a tuple of str */
int counted_reduce_scatter;   /* _direct.COUNTED_REDUCE_SCATTER: 1 non-blocking, 2 blocking */
Py_ssize_t counted_from;      /* _direct.COUNTED_FROM */
int sendrecv_posted;          /* _direct.SENDRECV_POSTED */
int exchanges;                /* _direct.EXCHANGES */
PyObject *s_append, *s_pop, *s_verify, *s_shape, *s_dtype, *s_synchronous, *s_async_op;

/* ------------------------------------------------------------------------------- Entry */

static PyTypeObject EntryType;

PyObject *new_entry(long long seq, PyObject *call, PyObject *shape, PyObject *dtype)
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


PyTypeObject CallBooksType;

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
    PyObject *record = PyObject_GetAttr(recorder, s_append);
    if (record == NULL) {
        Py_DECREF(recorder);
        return -1;
    }
    Py_XSETREF(b->recorder, recorder);
    Py_XSETREF(b->record, record);
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
                            &b->record,  &b->wait_long, &b->pending, &b->mpi_error,
                            &b->held,    &b->handle,  &b->front};
    for (size_t i = 0; i < sizeof objects / sizeof objects[0]; i++) {
        Py_INCREF(Py_None);
        *objects[i] = Py_None;
    }
    b->in_flight = PySet_New(NULL);
    if (b->in_flight == NULL) {
        Py_DECREF(b);
        return NULL;
    }
    b->reap_at = REAP_AT;
    return (PyObject *)b;
}

static int CallBooks_traverse(CallBooks *b, visitproc visit, void *arg)
{
    Py_VISIT(b->slots);
    Py_VISIT(b->inside);
    Py_VISIT(b->checker);
    Py_VISIT(b->recorder);
    Py_VISIT(b->record);
    Py_VISIT(b->wait_long);
    Py_VISIT(b->pending);
    Py_VISIT(b->mpi_error);
    Py_VISIT(b->held);
    Py_VISIT(b->handle);
    Py_VISIT(b->front);
    Py_VISIT(b->in_flight);
    return 0;
}

static int CallBooks_clear(CallBooks *b)
{
    Py_CLEAR(b->checker);
    Py_CLEAR(b->wait_long);
    Py_CLEAR(b->pending);
    Py_CLEAR(b->mpi_error);
    Py_CLEAR(b->held);
    Py_CLEAR(b->handle);
    Py_CLEAR(b->recorder);
    Py_CLEAR(b->record);
    Py_CLEAR(b->front);
    Py_CLEAR(b->in_flight);
    Py_CLEAR(b->scratch);
    return 0;
}

static void CallBooks_dealloc(CallBooks *b)
{
    PyObject_GC_UnTrack(b);
    CallBooks_clear(b);
    kept_drop(b);
    if (b->slot_word != NULL)
        PyBuffer_Release(&b->slots_view);
    if (b->inside_word != NULL)
        PyBuffer_Release(&b->inside_view);
    Py_CLEAR(b->slots);
    Py_CLEAR(b->inside);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyObject *CallBooks_forget_board(CallBooks *b, PyObject *unused)
{
    (void)unused;
    if (hold_word(Py_None, 0, &b->slots_view, &b->slot_word, &b->slots) < 0 ||
        hold_word(Py_None, 0, &b->inside_view, &b->inside_word, &b->inside) < 0)
        return NULL;
    Py_RETURN_NONE;
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

static PyObject *get_in_flight(CallBooks *b, void *unused)
{
    (void)unused;
    if (b->in_flight == NULL)
        Py_RETURN_NONE;
    return PyFrozenSet_New(b->in_flight);
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
    {"in_flight", (getter)get_in_flight, NULL,
     "the direct path's Works not yet complete (a frozenset of them)", NULL},
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
    M(kept_bytes, T_PYSSIZET, 0,
      "bytes per rank up to which synchronous calls are kept persistent requests (0: none)"),
    M(kept_all_to_all_in_place, T_BOOL, 0,
      "a kept all_to_all is made in MPI's in-place form, whatever the call's placement"),
    M(checker, T_OBJECT, 0, "check mode's Guard, or None"),
    M(recorder, T_OBJECT, READONLY, "the flight recorder: the last calls"),
    M(wait_long, T_OBJECT, 0, "wait_long(request, entry, arrays): the rest of a long wait"),
    M(pending, T_OBJECT, 0, "pending(request, entry, arrays): the backend's Pending"),
    M(mpi_error, T_OBJECT, 0, "mpi_error(call, error): raises it as the front end's error"),
    M(held, T_OBJECT, 0, "inside Communicator.group(): the Works of its direct-path calls"),
    M(handle, T_OBJECT, 0, "the direct path's MPI communicator, as the primitives take it"),
    M(front, T_OBJECT, 0, "the Communicator, whose waits finish a Work past the direct path"),
    {NULL, 0, 0, 0, NULL},
};
#undef M

static PyMethodDef books_methods[] = {
    {"take", (PyCFunction)CallBooks_take, METH_O,
     "take(call): take the token, or raise CommunicatorStateError naming call"},
    {"give", (PyCFunction)CallBooks_give, METH_NOARGS, "give(): give the token back"},
    {"hand_over", (PyCFunction)CallBooks_hand_over, METH_NOARGS,
     "hand_over(): every direct-path call in flight to the backend, as its Pending"},
    {"let_go_kept", (PyCFunction)CallBooks_let_go_kept, METH_NOARGS,
     "let_go_kept() -> how many kept requests are still active (a call timed out): let go "
     "of the others, before the communicator is freed"},
    {"forget_board", (PyCFunction)CallBooks_forget_board, METH_NOARGS,
     "forget_board(): let go of the progress board (before it is closed)"},
    {"number", (PyCFunction)(void (*)(void))CallBooks_number, METH_FASTCALL,
     "number(call, array, name, op, root, async_op) -> seq: number one call (check mode may "
     "verify)"},
    {"all_reduce", (PyCFunction)(void (*)(void))CallBooks_all_reduce, METH_FASTCALL,
     "all_reduce(x, op, out, async_op) -> the result, its Work, or NotImplemented"},
    {"broadcast", (PyCFunction)(void (*)(void))CallBooks_broadcast, METH_FASTCALL,
     "broadcast(x, root, async_op) -> x, its Work, or NotImplemented"},
    {"reduce", (PyCFunction)(void (*)(void))CallBooks_reduce, METH_FASTCALL,
     "reduce(x, root, op, out, async_op) -> the result, its Work, or NotImplemented"},
    {"all_gather", (PyCFunction)(void (*)(void))CallBooks_all_gather, METH_FASTCALL,
     "all_gather(x, out, async_op) -> the result, its Work, or NotImplemented"},
    {"reduce_scatter", (PyCFunction)(void (*)(void))CallBooks_reduce_scatter, METH_FASTCALL,
     "reduce_scatter(x, op, out, async_op) -> the result, its Work, or NotImplemented"},
    {"all_to_all", (PyCFunction)(void (*)(void))CallBooks_all_to_all, METH_FASTCALL,
     "all_to_all(x, out, async_op) -> the result, its Work, or NotImplemented"},
    {"gather", (PyCFunction)(void (*)(void))CallBooks_gather, METH_FASTCALL,
     "gather(x, root, out, async_op) -> the result, its Work, or NotImplemented"},
    {"scatter", (PyCFunction)(void (*)(void))CallBooks_scatter, METH_FASTCALL,
     "scatter(x, root, out, async_op) -> the result, its Work, or NotImplemented"},
    {"send", (PyCFunction)(void (*)(void))CallBooks_send, METH_FASTCALL,
     "send(x, peer, async_op) -> None, its Work, or NotImplemented"},
    {"recv", (PyCFunction)(void (*)(void))CallBooks_recv, METH_FASTCALL,
     "recv(x, peer, async_op) -> x, its Work, or NotImplemented"},
    {"sendrecv", (PyCFunction)(void (*)(void))CallBooks_sendrecv, METH_FASTCALL,
     "sendrecv(x, peer, out, source, async_op) -> out, its Work, or NotImplemented"},
    {"barrier", (PyCFunction)CallBooks_barrier, METH_O,
     "barrier(async_op) -> None, its Work, or NotImplemented"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject CallBooksType = {
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
 * reduce_op, empty, counted_reduce_scatter, counted_from, sendrecv_posted, exchanges,
 * py_reduce_local): _direct.py's, once */
static PyObject *use_primitives(PyObject *self, PyObject *args)
{
    PyObject *capsule, *objects[9];
    PyObject **slots[9] = {&py_post,  &py_poll,   &kind_names, &ndarray,        &fast_type,
                           &fast_op,  &reduce_op, &empty,      &py_reduce_local};
    (void)self;
    int counted, posted, exchange;
    Py_ssize_t from;
    if (!PyArg_ParseTuple(args, "OOOO!OO!O!OOinppO", &capsule, &objects[0], &objects[1],
                          &PyTuple_Type, &objects[2], &objects[3], &PyDict_Type, &objects[4],
                          &PyDict_Type, &objects[5], &objects[6], &objects[7], &counted, &from,
                          &posted, &exchange, &objects[8]))
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
    counted_reduce_scatter = counted;
    counted_from = from;
    sendrecv_posted = posted;
    exchanges = exchange;
    for (int i = 0; i < 9; i++) {
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
     "reduce_op, empty, counted_reduce_scatter, counted_from, sendrecv_posted, exchanges, "
     "py_reduce_local)"},
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
    } names[] = {{&s_append, "append"},           {&s_pop, "pop"},
                 {&s_verify, "verify"},           {&s_shape, "shape"},
                 {&s_dtype, "dtype"},             {&s_synchronous, "synchronous"},
                 {&s_async_op, "async_op=True"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].name = PyUnicode_InternFromString(names[i].text);
        if (*names[i].name == NULL)
            return NULL;
    }
    if (PyType_Ready(&EntryType) < 0 || PyType_Ready(&CallBooksType) < 0 || work_ready() < 0 ||
        front_ready() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&EntryType);
    Py_INCREF(&CallBooksType);
    Py_INCREF(&WorkType);
    Py_INCREF(&DirectVerbType);
    if (PyModule_AddObject(m, "Entry", (PyObject *)&EntryType) < 0 ||
        PyModule_AddObject(m, "CallBooks", (PyObject *)&CallBooksType) < 0 ||
        PyModule_AddObject(m, "Work", (PyObject *)&WorkType) < 0 ||
        PyModule_AddObject(m, "DirectVerb", (PyObject *)&DirectVerbType) < 0 ||
        PyModule_AddIntConstant(m, "REAP_AT", REAP_AT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

