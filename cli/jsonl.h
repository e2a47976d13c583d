/* jsonl.h — a small, strict reader for one line of a JSONL log: a flat JSON object whose
 * values are numbers, strings, true, false or null (what a training program's --log
 * writes; programs/train_main.c). Nested arrays and objects are checked and skipped, so a
 * field added later in that form does not stop `kiln plot`. It reads only the bytes it is
 * given (no NUL terminator needed, NUL bytes are an error), whatever they are. */
#ifndef KILN_CLI_JSONL_H
#define KILN_CLI_JSONL_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { JSONL_NUMBER, JSONL_STRING, JSONL_BOOL, JSONL_NULL, JSONL_NESTED } JsonlKind;

typedef struct {
    char *key;   /* decoded (escapes resolved), NUL-terminated */
    JsonlKind kind;
    double num;  /* JSONL_NUMBER (may be NaN or infinite: see jsonl_parse); JSONL_BOOL: 0 or 1 */
} JsonlField;

typedef struct {
    JsonlField *fields;
    int n, cap;
} JsonlObject;

/* Parses s[0..len) (one line, without its newline) as one JSON object, into *out (emptied
 * first). Besides JSON's numbers it takes the bare words nan, inf and -inf (any case),
 * which C's printf writes for a diverged loss. Returns 0, or -1 with *col (1-based byte
 * column) and msg set. */
int jsonl_parse(const char *s, size_t len, JsonlObject *out, int *col, char *msg, size_t msgsize);
/* The value of key when it is a number (NULL/false otherwise). */
bool jsonl_number(const JsonlObject *o, const char *key, double *out);
void jsonl_free(JsonlObject *o);

#endif
