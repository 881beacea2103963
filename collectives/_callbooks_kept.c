/* Small synchronous collectives as persistent MPI requests, kept from call to call (part of
 * collectives._callbooks; _callbooks.c says what the module is).
 *
 * A persistent request (MPI 4.0's MPI_<call>_init) sets a collective up once; started
 * again at 8 B to 1 KiB, MPI_Start and MPI_Test took 0.43 to 0.73 of the time of MPICH's
 * blocking call, less of its non-blocking one's (Open MPI's: 0.6 to 1.05 of its blocking
 * call; benchmarks/README.md). A persistent request is bound to its buffers, while each call
 * brings its own arrays: so a kept request runs on buffers of its own, the stage, and a
 * call copies its input in and its result out (up to 1 KiB a rank, by default).
 *
 * Whether a call is kept depends only on what every rank passes alike (its kind, count,
 * datatype, op and root) and on the calls before it, so every rank starts the same request at
 * the same point; requests are made and let go in the same order on every rank, as MPI asks
 * of persistent collectives. A call with async_op=True, or inside a group, is never kept:
 * its request would still be active at the next call on some ranks and not others. MPI
 * never matches a persistent collective with another form of the call, so calls are kept
 * only where every rank must make a call alike, synchronous or not (books.kept_bytes is 0
 * where ranks were told they may mix the forms: init(mpi_blocking=False)); a kept call is
 * polled under the timeout, as a non-blocking one is, never blocking. */
#include "_callbooks.h"

/* how many requests a communicator keeps: the least recently used one goes */
#define KEPT 8

struct Kept {
    int kind, root;
    long long count;
    unsigned long long comm, datatype, op, request; /* request 0: an empty place */
    Py_ssize_t bytes;      /* one rank's message: count elements */
    char *stage, *stage2;  /* what the request reads and writes (stage2: all_to_all's recv) */
    int active;            /* started, not yet seen complete */
    unsigned long long used;
};

static int kept_kind(int kind)
{
    return kind != SEND && kind != RECV && kind != SENDRECV;
}

/* Lets go of one request and its stage: 0, or the MPI error code. */
static int let_go(Kept *k)
{
    int rc = k->request != 0 ? primitives->release(&k->request) : 0;
    PyMem_Free(k->stage);
    PyMem_Free(k->stage2);
    memset(k, 0, sizeof *k);
    return rc;
}

/* The stage's send and recv as post() takes them (NULL: MPI_IN_PLACE where the call has an
 * in-place form), for this rank. */
static void stage_buffers(const CallBooks *b, const Kept *k, const void **send, void **recv)
{
    int mine = b->rank == k->root;
    *send = NULL;
    *recv = k->stage;
    switch (k->kind) {
    case REDUCE:
    case GATHER:
        if (!mine) { /* the root receives */
            *send = k->stage;
            *recv = NULL;
        }
        break;
    case SCATTER:
        if (mine) { /* the root's own part stays where it is (in place) */
            *send = k->stage;
            *recv = NULL;
        }
        break;
    case ALL_TO_ALL: /* no stage2: MPI's in-place form (books.kept_all_to_all_in_place) */
        *send = k->stage2 != NULL ? k->stage : NULL;
        *recv = k->stage2 != NULL ? k->stage2 : k->stage;
        break;
    }
}

/* How many bytes of stage a kind needs, for one rank's message of `bytes`. */
static Py_ssize_t stage_bytes(const CallBooks *b, int kind, int root, Py_ssize_t bytes)
{
    int whole = kind == ALL_GATHER || kind == REDUCE_SCATTER || kind == ALL_TO_ALL ||
                ((kind == GATHER || kind == SCATTER) && b->rank == root);
    return whole ? bytes * b->size : bytes;
}

/* The kept request for call `c`, made if need be; NULL: the call is not kept (or an error
 * is set: *failed 1). */
Kept *kept_for(CallBooks *b, const Call *c, int *failed)
{
    *failed = 0;
    if (b->kept_bytes <= 0 || primitives == NULL || primitives->init == NULL ||
        !kept_kind(c->kind) || c->async_op || b->grouped || c->counted || c->exchange)
        return NULL;
    Py_ssize_t bytes = 0;
    if (c->kind != BARRIER) { /* what every rank has alike: the count and the dtype */
        Py_ssize_t itemsize = c->array_view != NULL ? c->array_view->itemsize : 0;
        if (c->array_view == NULL) { /* an array the verb made */
            PyObject *n = PyObject_GetAttrString(c->array, "itemsize");
            itemsize = n == NULL ? -1 : PyLong_AsSsize_t(n);
            Py_XDECREF(n);
            if (itemsize < 0) {
                *failed = 1;
                return NULL;
            }
        }
        bytes = (Py_ssize_t)c->count * itemsize;
        if (bytes > b->kept_bytes || bytes == 0)
            return NULL;
    }
    int bad[3];
    unsigned long long comm = handle_of(b->handle, &bad[0]);
    unsigned long long datatype = handle_of(c->datatype, &bad[1]);
    unsigned long long op = handle_of(c->mpi_op, &bad[2]);
    if (bad[0] || bad[1] || bad[2]) {
        *failed = 1;
        return NULL;
    }
    if (b->kept == NULL && (b->kept = PyMem_Calloc(KEPT, sizeof(Kept))) == NULL) {
        PyErr_NoMemory();
        *failed = 1;
        return NULL;
    }
    int root = c->kind == BROADCAST || c->kind == REDUCE || c->kind == GATHER ||
                       c->kind == SCATTER
                   ? c->root_rank
                   : 0;
    Kept *k = b->kept, *oldest = NULL;
    for (int i = 0; i < KEPT; i++, k++) {
        if (k->request != 0 && k->kind == c->kind && k->count == c->count &&
            k->comm == comm && k->datatype == datatype && k->op == op && k->root == root) {
            if (k->active) /* a call that timed out: the communicator is dead */
                return NULL;
            k->used = ++b->kept_clock;
            return k;
        }
        if (!k->active && (oldest == NULL || k->used < oldest->used))
            oldest = k;
    }
    if (oldest == NULL)
        return NULL;
    k = oldest;
    int rc = let_go(k);
    if (rc == 0) {
        Py_ssize_t n = stage_bytes(b, c->kind, root, bytes);
        *k = (Kept){c->kind, root, c->count, comm, datatype, op, 0, bytes, NULL, NULL, 0, 0};
        if (c->kind != BARRIER &&
            ((k->stage = PyMem_Malloc(n)) == NULL ||
             (c->kind == ALL_TO_ALL && !b->kept_all_to_all_in_place &&
              (k->stage2 = PyMem_Malloc(n)) == NULL))) {
            let_go(k);
            PyErr_NoMemory();
            *failed = 1;
            return NULL;
        }
        const void *send;
        void *recv;
        stage_buffers(b, k, &send, &recv);
        rc = primitives->init(c->kind, comm, send, recv, c->count, datatype, op, root,
                              &k->request);
    }
    if (rc != 0) {
        k->request = 0;
        let_go(k);
        PyObject *code = PyLong_FromLong(rc);
        if (code != NULL) {
            PyErr_SetObject(mpi_exception, code);
            Py_DECREF(code);
        }
        *failed = 1;
        return NULL;
    }
    k->used = ++b->kept_clock;
    return k;
}

/* The call's input copied into the stage, where the request reads it. */
void kept_in(CallBooks *b, const Kept *k, const void *send, const void *recv)
{
    Py_ssize_t n = k->bytes, mine = b->rank * n;
    const char *from = send != NULL ? send : recv; /* in place: the input is in recv */
    switch (k->kind) {
    case ALL_REDUCE:
    case REDUCE:
        memcpy(k->stage, from, n);
        break;
    case BROADCAST:
        if (b->rank == k->root)
            memcpy(k->stage, recv, n);
        break;
    case ALL_GATHER:
        memcpy(k->stage + mine, send != NULL ? from : from + mine, n);
        break;
    case GATHER:
        if (b->rank != k->root)
            memcpy(k->stage, from, n);
        else
            memcpy(k->stage + mine, send != NULL ? from : from + mine, n);
        break;
    case REDUCE_SCATTER:
    case ALL_TO_ALL:
        memcpy(k->stage, from, n * b->size);
        break;
    case SCATTER:
        if (b->rank == k->root)
            memcpy(k->stage, send, n * b->size);
        break;
    }
}

/* The call's result copied from the stage to `recv` (NULL: none here). */
void kept_out(CallBooks *b, Kept *k, void *recv)
{
    Py_ssize_t n = k->bytes;
    int mine = b->rank == k->root;
    k->active = 0;
    if (recv == NULL)
        return;
    switch (k->kind) {
    case ALL_REDUCE:
    case REDUCE_SCATTER:
        memcpy(recv, k->stage, n);
        break;
    case BROADCAST:
    case REDUCE:
        if (k->kind == REDUCE ? mine : !mine)
            memcpy(recv, k->stage, n);
        break;
    case ALL_GATHER:
        memcpy(recv, k->stage, n * b->size);
        break;
    case GATHER:
        if (mine)
            memcpy(recv, k->stage, n * b->size);
        break;
    case ALL_TO_ALL:
        memcpy(recv, k->stage2 != NULL ? k->stage2 : k->stage, n * b->size);
        break;
    case SCATTER:
        memcpy(recv, mine ? k->stage + b->rank * n : k->stage, n);
        break;
    }
}

/* Lets go of every kept request (before the communicator is freed): how many could not be,
 * being still active (a call that timed out); their stage stays. */
PyObject *CallBooks_let_go_kept(CallBooks *b, PyObject *unused)
{
    (void)unused;
    long active = 0;
    if (b->kept != NULL) {
        for (int i = 0; i < KEPT; i++) {
            Kept *k = &b->kept[i];
            if (k->active) {
                int done = 0;
                if (primitives->poll(&k->request, -1.0, &done) != 0 || !done) {
                    active++;
                    continue;
                }
                k->active = 0;
            }
            let_go(k);
        }
        if (active == 0) {
            PyMem_Free(b->kept);
            b->kept = NULL;
        }
    }
    return PyLong_FromLong(active);
}

/* The request that a kept call starts and polls. */
unsigned long long *kept_request(Kept *k)
{
    k->active = 1;
    return &k->request;
}

/* What the books keep, let go of without MPI (the books are going, and MPI may be
 * finalized): the requests are left to MPI_Finalize, the stage of an active one to MPI. */
void kept_drop(CallBooks *b)
{
    if (b->kept == NULL)
        return;
    for (int i = 0; i < KEPT; i++) {
        if (!b->kept[i].active) {
            PyMem_Free(b->kept[i].stage);
            PyMem_Free(b->kept[i].stage2);
        }
    }
    PyMem_Free(b->kept);
    b->kept = NULL;
}
