/* import.h — `kiln import` (cli/import.c). */
#ifndef KILN_CLI_IMPORT_H
#define KILN_CLI_IMPORT_H

#include <stddef.h>

/* Writes the ONNX model at onnx_path as the Kiln model file `out` and its weights beside
 * it; the command's exit status (0, or 1 with the error printed). */
int cli_import(const char *onnx_path, const char *out);

/* Writes data to path via a temp file in the same directory, fsync and rename (main.c);
 * 1 with the error printed. */
int cli_write_atomic(const char *path, const char *data, size_t len);

#endif
