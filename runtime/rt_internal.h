/* rt_internal.h — helpers the runtime's files share and generated programs do not see. */
#ifndef KILN_RT_INTERNAL_H
#define KILN_RT_INTERNAL_H

#include "kiln_rt.h"

/* Fills err (when not NULL) with code and a formatted message; returns code. */
krt_status krt_fail(krt_error *err, krt_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A failed system call on path: "PATH: WHAT: strerror(e)", KRT_ENOSPC with "(disk full)"
 * for a full disk or quota, KRT_EIO otherwise. */
krt_status krt_fail_errno(krt_error *err, int e, const char *path, const char *what);
/* Clears err; returns KRT_OK. */
krt_status krt_ok(krt_error *err);

#endif
