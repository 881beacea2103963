/* The direct path's MPI primitives in C for Open MPI's ABI (pointer handles, int counts):
 * _fastmpi.c, built once more with pointer handles (a file of its own, so that each build has
 * its own object). */
#define FASTMPI_POINTER_HANDLES 1
#include "_fastmpi.c"
