/* profile.c — what the training program's --bench-steps and --profile print with: the
 * median of timings, the peak resident memory, and the table of a step's kernels by
 * function (kernels with the same code, as a model's layers, share one), slowest first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "kiln_model.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double kiln_median(double *v, int64_t n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Peak resident set size of the process so far, in MiB. */
double kiln_peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

typedef struct {
    const char *function, *what;
    unsigned line, lines; /* the first kernel's model line; how many other lines */
    int calls;
    double seconds;
} ProfileRow;

static int cmp_row(const void *a, const void *b)
{
    double x = ((const ProfileRow *)a)->seconds, y = ((const ProfileRow *)b)->seconds;
    return x > y ? -1 : x < y;
}

void kiln_print_profile(const char *title, const kiln_kernel_info *info, int nk, const double *seconds, const char *const *extra,
                        const double *extra_seconds, int nextra, int64_t n, double total)
{
    ProfileRow *rows = calloc((size_t)(nk + nextra) + 1, sizeof *rows);
    if (!rows) return;
    int nrows = 0;
    double kernels = 0;
    for (int k = 0; k < nk; k++) {
        int r = 0;
        while (r < nrows && strcmp(rows[r].function, info[k].function)) r++;
        if (r == nrows) rows[nrows++] = (ProfileRow){info[k].function, info[k].what, info[k].line, 0, 0, 0};
        else if (info[k].line != rows[r].line) rows[r].lines++;
        rows[r].calls++;
        rows[r].seconds += seconds[k];
        kernels += seconds[k];
    }
    for (int e = 0; e < nextra; e++) rows[nrows++] = (ProfileRow){extra[e], "", 0, 0, 1, extra_seconds[e]};
    qsort(rows, (size_t)nrows, sizeof *rows, cmp_row);
    printf("profile: %s, %lld steps: %.3f ms per step, %.3f ms in its %d kernels\n", title, (long long)n, 1e3 * total / (double)n,
           1e3 * kernels / (double)n, nk);
    int width = 22; /* the functions' column: as wide as their longest name */
    for (int r = 0; r < nrows; r++)
        if ((int)strlen(rows[r].function) > width) width = (int)strlen(rows[r].function);
    printf("  %10s %6s %5s  %-*s %-8s %s\n", "ms/step", "%", "calls", width, "function", "line", "what");
    for (int r = 0; r < nrows; r++) {
        char line[32] = "";
        if (rows[r].line) snprintf(line, sizeof line, rows[r].lines ? "%u+%u" : "%u", rows[r].line, rows[r].lines);
        printf("  %10.3f %6.1f %5d  %-*s %-8s %s\n", 1e3 * rows[r].seconds / (double)n, total > 0 ? 100 * rows[r].seconds / total : 0,
               rows[r].calls, width, rows[r].function, line, rows[r].what);
    }
    fflush(stdout);
    free(rows);
}

