/* inspect.h — kiln check's listing, kiln gradcheck and kiln tokens (inspect.c). */
#ifndef KILN_CLI_INSPECT_H
#define KILN_CLI_INSPECT_H

#include "../frontend/frontend.h"
#include "options.h"

/* kiln check: the model's parameters, buffers, inputs, outputs, sizes and recipe, from its
 * graph as lowered. */
void cli_print_check(const Graph *g, const Recipe *recipe, const char *file, StrBuf *out);
/* kiln gradcheck: the table of every parameter's gradient check; exit status 0 or 1. */
int cli_gradcheck(const Options *o, const Graph *g);
/* kiln tokens GLOB -o OUT: byte-level tokens of text files; exit status. */
int cli_tokens(int argc, char **argv);

#endif
