/* pieces.h — a generated model.c cut into pieces that compile on their own (pieces.c), so
 * that kiln build compiles them on all cores and caches each one's object by its code
 * (objcache.h): groups of kernels, one piece of the recipe (data that changes with the
 * train section) and one of the host code (tables, step functions, kiln_model_def). */
#ifndef KILN_CLI_PIECES_H
#define KILN_CLI_PIECES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { PIECE_KERNELS, PIECE_STEP, PIECE_RECIPE, PIECE_HOST, PIECE_WHOLE } PieceKind; /* PIECE_STEP: parts of a step */

typedef struct {
    PieceKind kind;
    char *text;    /* the C to compile (malloc'd; self-contained: it defines KILN_PART) */
    size_t len;
    int nkernels;  /* kernels in a PIECE_KERNELS piece */
    bool cacheable; /* false: its object depends on more than its text (.incbin of a file) */
} Piece;

typedef struct {
    Piece *v;
    int n;
    /* the header's #include lines, which every piece includes first: what a precompiled
     * header can hold (NULL for a PIECE_WHOLE file) */
    char *includes;
} PieceSet;

/* Cuts model.c (as codegen/c.c writes it: a header up to the first KILN_PART guard,
 * kernels defined as `KILN_KERNEL void NAME(...)\n{\n...\n}\n`) into pieces. A kernel piece
 * ends after a kernel whose code (comments left out) hashes to 0 mod split, or at
 * PIECES_MAX_KERNELS kernels: the boundaries depend on the kernels' own code, so changing
 * or inserting one kernel changes only its piece and leaves the later boundaries where
 * they were (or the next piece too, when the changed kernel's own boundary moved). A step
 * split into parts (over 256 kernels) has its parts in pieces of their own, grouped the
 * same way. A file it does not recognise is one PIECE_WHOLE piece (compiled as one file,
 * every kernel static). Kernel pieces come first, then the step parts', the recipe's, the
 * host's. */
void pieces_split(const char *model_c, size_t len, int split, PieceSet *out);
void pieces_free(PieceSet *s);

/* The text without its C comments (newlines kept, so that __LINE__ stays): what a cache
 * key hashes, since the kernels' comments cite the model file's path and line numbers,
 * which do not change the object (built without -g). malloc'd, its length in *out_len. */
char *pieces_strip_comments(const char *s, size_t len, size_t *out_len);

/* Whether a group of n functions ends after the one at [p, stop): by its code alone (without
 * comments), hashing to 0 mod split, or at max functions. The C pieces' kernels and step
 * parts, and the CUDA kernels' NVRTC pieces (cuda_report.c), are grouped so. */
bool pieces_group_ends(const char *p, const char *stop, int split, int n, int max);

/* A 128-bit hash (not cryptographic) of n bytes, continuing from h (zeroed to start). */
void pieces_hash128(const void *data, size_t n, uint64_t h[2]);

/* split for Clang in this process: one kernel a piece. With the precompiled header
 * (objcache.c) a piece costs about 5 ms of Clang's time besides its code; gpt's cold build
 * takes 2.49 s of CPU in 93 pieces against 2.27 s in 48 (split 2) and 2.09 s as model.c's
 * two halves, and after a change of gpt's MLP width the rebuild compiles 0.48 s of it,
 * against 0.92 s with split 2 and 1.2 s with split 4. An external compiler is a process a
 * piece (gcc: about 50 ms each), so its pieces are larger: PIECES_SPLIT_EXTERNAL. */
#define PIECES_SPLIT_IN_PROCESS 1
#define PIECES_SPLIT_EXTERNAL 8
#define PIECES_MAX_KERNELS 12 /* and a piece holds at most this many kernels */
/* A step of over 256 kernels is split into parts (codegen/host.c); they go to pieces of
 * their own, grouped as the kernels are: 8 parts of a 10,000-layer chain compile in 0.7 s,
 * its 197 in one piece took 25 s. */
#define PIECES_SPLIT_STEP_PARTS 4
#define PIECES_MAX_STEP_PARTS 8

#endif
