/* The communicator's verbs where the direct path applies, as C callables (part of
 * collectives._callbooks). A `DirectVerb` stands in for one `Communicator` method on the
 * instance: it takes the method's own arguments (positional or by keyword, with its
 * defaults), runs the books' verb of the same name (_callbooks_verbs.c), and where that
 * gives NotImplemented (arguments the direct path does not take, another thread, ...) calls
 * the method itself, which runs the general path or names the error. A Python method frame
 * costs about a sixth of a small blocking MPI call (~0.17 us of ~1 us on Open MPI): this is
 * what the direct path's calls no longer pay. */
#include "_callbooks.h"

/* How a parameter may be left out: not at all, or for one of these defaults. */
enum { REQUIRED, SUM, ZERO, NONE, FALSE };

#define MAX_PARAMS 5

/* One verb's signature: its parameters in order (the first `positional` may be given by
 * position, the rest by keyword only), each with its default; and the books' verb, which
 * takes them in that order. */
typedef struct {
    const char *name;
    PyObject *(*verb)(CallBooks *, PyObject *const *, Py_ssize_t);
    int positional, count;
    const char *params[MAX_PARAMS];
    int defaults[MAX_PARAMS];
} Signature;

static PyObject *barrier_verb(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    (void)nargs;
    return CallBooks_barrier(b, args[0]);
}

static const Signature signatures[] = {
    {"all_reduce", CallBooks_all_reduce, 2, 4, {"x", "op", "out", "async_op"},
     {REQUIRED, SUM, NONE, FALSE}},
    {"reduce", CallBooks_reduce, 3, 5, {"x", "root", "op", "out", "async_op"},
     {REQUIRED, ZERO, SUM, NONE, FALSE}},
    {"broadcast", CallBooks_broadcast, 2, 3, {"x", "root", "async_op"}, {REQUIRED, ZERO, FALSE}},
    {"all_gather", CallBooks_all_gather, 1, 3, {"x", "out", "async_op"}, {REQUIRED, NONE, FALSE}},
    {"reduce_scatter", CallBooks_reduce_scatter, 2, 4, {"x", "op", "out", "async_op"},
     {REQUIRED, SUM, NONE, FALSE}},
    {"all_to_all", CallBooks_all_to_all, 1, 3, {"x", "out", "async_op"}, {REQUIRED, NONE, FALSE}},
    {"gather", CallBooks_gather, 2, 4, {"x", "root", "out", "async_op"},
     {REQUIRED, ZERO, NONE, FALSE}},
    {"scatter", CallBooks_scatter, 2, 4, {"x", "root", "out", "async_op"},
     {NONE, ZERO, NONE, FALSE}},
    {"send", CallBooks_send, 2, 3, {"x", "peer", "async_op"}, {REQUIRED, REQUIRED, FALSE}},
    {"recv", CallBooks_recv, 2, 3, {"x", "peer", "async_op"}, {REQUIRED, REQUIRED, FALSE}},
    {"sendrecv", CallBooks_sendrecv, 2, 5, {"x", "peer", "out", "source", "async_op"},
     {REQUIRED, REQUIRED, NONE, NONE, FALSE}},
    {"barrier", barrier_verb, 0, 1, {"async_op"}, {FALSE}},
};
#define VERBS ((int)(sizeof signatures / sizeof signatures[0]))

static PyObject *s_sum, *zero;       /* the defaults "sum" and 0 */
static PyObject *param_names[VERBS][MAX_PARAMS]; /* the parameters' names, interned */

typedef struct {
    PyObject_HEAD
    CallBooks *books;
    const Signature *signature;
    PyObject *method; /* the Communicator's method (a function): the general path */
    vectorcallfunc vectorcall;
} DirectVerb;

/* The parameter `name` is of (its index), or -1. */
static int param_index(int verb, const Signature *s, PyObject *name)
{
    for (int i = 0; i < s->count; i++)
        if (name == param_names[verb][i])
            return i;
    for (int i = 0; i < s->count; i++) /* a keyword that was not interned */
        if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, s->params[i]) == 0)
            return i;
    return -1;
}

/* The method, on the communicator, with the arguments as given. */
static PyObject *general(DirectVerb *v, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    Py_ssize_t total = nargs + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames));
    PyObject *small[1 + MAX_PARAMS + 2], **stack = small;
    if (total + 1 > (Py_ssize_t)(sizeof small / sizeof small[0])) {
        stack = PyMem_Malloc((total + 1) * sizeof(PyObject *));
        if (stack == NULL)
            return PyErr_NoMemory();
    }
    stack[0] = v->books->front;
    memcpy(stack + 1, args, total * sizeof(PyObject *));
    PyObject *r = PyObject_Vectorcall(v->method, stack, nargs + 1, kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return r;
}

static PyObject *DirectVerb_vectorcall(DirectVerb *v, PyObject *const *args, size_t nargsf,
                                       PyObject *kwnames)
{
    const Signature *s = v->signature;
    int verb = (int)(s - signatures);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *given[MAX_PARAMS] = {NULL};
    if (nargs > s->positional || v->books->front == NULL)
        return general(v, args, nargs, kwnames);
    for (Py_ssize_t i = 0; i < nargs; i++)
        given[i] = args[i];
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < keywords; k++) {
        int i = param_index(verb, s, PyTuple_GET_ITEM(kwnames, k));
        if (i < 0 || given[i] != NULL) /* the method raises the TypeError */
            return general(v, args, nargs, kwnames);
        given[i] = args[nargs + k];
    }
    for (int i = 0; i < s->count; i++) {
        if (given[i] != NULL)
            continue;
        switch (s->defaults[i]) {
        case REQUIRED:
            return general(v, args, nargs, kwnames);
        case SUM:
            given[i] = s_sum;
            break;
        case ZERO:
            given[i] = zero;
            break;
        case NONE:
            given[i] = Py_None;
            break;
        default:
            given[i] = Py_False;
        }
    }
    PyObject *r = s->verb(v->books, given, s->count);
    if (r != Py_NotImplemented)
        return r;
    Py_DECREF(r);
    return general(v, args, nargs, kwnames);
}

/* DirectVerb(books, name, method) */
static PyObject *DirectVerb_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *books, *method;
    const char *name;
    static char *names[] = {"books", "name", "method", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OsO", names, &books, &name, &method))
        return NULL;
    if (!PyObject_TypeCheck(books, &CallBooksType)) {
        PyErr_SetString(PyExc_TypeError, "DirectVerb: books must be CallBooks");
        return NULL;
    }
    const Signature *s = NULL;
    for (int i = 0; i < VERBS; i++)
        if (strcmp(signatures[i].name, name) == 0)
            s = &signatures[i];
    if (s == NULL) {
        PyErr_Format(PyExc_ValueError, "DirectVerb: no verb %s", name);
        return NULL;
    }
    DirectVerb *v = (DirectVerb *)type->tp_alloc(type, 0);
    if (v == NULL)
        return NULL;
    Py_INCREF(books);
    Py_INCREF(method);
    v->books = (CallBooks *)books;
    v->signature = s;
    v->method = method;
    v->vectorcall = (vectorcallfunc)DirectVerb_vectorcall;
    return (PyObject *)v;
}

static int DirectVerb_traverse(DirectVerb *v, visitproc visit, void *arg)
{
    Py_VISIT(v->books);
    Py_VISIT(v->method);
    return 0;
}

static int DirectVerb_clear(DirectVerb *v)
{
    Py_CLEAR(v->books);
    Py_CLEAR(v->method);
    return 0;
}

static void DirectVerb_dealloc(DirectVerb *v)
{
    PyObject_GC_UnTrack(v);
    DirectVerb_clear(v);
    Py_TYPE(v)->tp_free((PyObject *)v);
}

/* What introspection asks of a method: its name, docs, and (through __wrapped__, which
 * inspect.signature follows) the method bound to the communicator. */
static PyObject *DirectVerb_wrapped(DirectVerb *v, void *unused)
{
    (void)unused;
    return PyMethod_New(v->method, v->books->front != NULL ? v->books->front : Py_None);
}

static PyObject *DirectVerb_attribute(DirectVerb *v, void *name)
{
    return PyObject_GetAttrString(v->method, (const char *)name);
}

static PyGetSetDef DirectVerb_getset[] = {
    {"__wrapped__", (getter)DirectVerb_wrapped, NULL, "the method, bound", NULL},
    {"__doc__", (getter)DirectVerb_attribute, NULL, NULL, (void *)"__doc__"},
    {"__name__", (getter)DirectVerb_attribute, NULL, NULL, (void *)"__name__"},
    {"__qualname__", (getter)DirectVerb_attribute, NULL, NULL, (void *)"__qualname__"},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *DirectVerb_repr(DirectVerb *v)
{
    return PyUnicode_FromFormat("<direct-path verb %s of %R>", v->signature->name,
                                v->books->front != NULL ? v->books->front : Py_None);
}

PyTypeObject DirectVerbType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives._callbooks.DirectVerb",
    .tp_basicsize = sizeof(DirectVerb),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "DirectVerb(books, name, method): method's arguments, the direct path first",
    .tp_new = DirectVerb_new,
    .tp_dealloc = (destructor)DirectVerb_dealloc,
    .tp_traverse = (traverseproc)DirectVerb_traverse,
    .tp_clear = (inquiry)DirectVerb_clear,
    .tp_vectorcall_offset = offsetof(DirectVerb, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getset = DirectVerb_getset,
    .tp_repr = (reprfunc)DirectVerb_repr,
};

int front_ready(void)
{
    s_sum = PyUnicode_InternFromString("sum");
    zero = PyLong_FromLong(0);
    if (s_sum == NULL || zero == NULL)
        return -1;
    for (int v = 0; v < VERBS; v++)
        for (int i = 0; i < signatures[v].count; i++)
            if ((param_names[v][i] = PyUnicode_InternFromString(signatures[v].params[i])) ==
                NULL)
                return -1;
    return PyType_Ready(&DirectVerbType);
}
