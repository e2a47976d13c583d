/* test_math.c — the vectorisable float exp and tanh of generated kernels (runtime/
 * kiln_math.h) against double precision: relative error over a dense sweep of the float
 * range, and the special values (NaN, infinities, overflow, underflow, signed zero). */
#include <criterion/criterion.h>
#include <math.h>

#include "../runtime/kiln_math.h"

static double ulps(float got, double want)
{
    float w = (float)want;
    if (got == w) return 0;
    double spacing = fabs((double)nextafterf(w, INFINITY) - (double)w);
    return fabs((double)got - want) / spacing;
}

Test(math, expf_is_within_two_ulp)
{
    double worst = 0;
    for (float x = -87.0f; x <= 88.5f; x += 0.00731f) {
        double u = ulps(kiln_expf(x), exp((double)x));
        if (u > worst) worst = u;
    }
    cr_expect(worst <= 2.0, "worst error %.2f ulp", worst);
}

Test(math, expf_special_values)
{
    cr_expect(isnan(kiln_expf(NAN)));
    cr_expect_eq(kiln_expf(INFINITY), INFINITY);
    cr_expect_eq(kiln_expf(-INFINITY), 0.0f);
    cr_expect_eq(kiln_expf(100.0f), INFINITY);
    cr_expect_eq(kiln_expf(-200.0f), 0.0f);
    cr_expect_eq(kiln_expf(0.0f), 1.0f);
    /* subnormal results: within a few of the smallest steps */
    float s = kiln_expf(-100.0f);
    cr_expect(s > 0 && fabs((double)s - exp(-100.0)) < 4e-45, "exp(-100) = %g", (double)s);
}

Test(math, tanhf_is_accurate)
{
    double worst = 0;
    for (float x = -12.0f; x <= 12.0f; x += 0.000913f) {
        double want = tanh((double)x);
        double err = fabs((double)kiln_tanhf(x) - want) / fmax(fabs(want), 1e-30);
        if (err > worst) worst = err;
    }
    cr_expect(worst < 5e-7, "worst relative error %g", worst);
    /* small arguments, down to the subnormals, keep their relative accuracy */
    worst = 0;
    for (float x = 1e-40f; x < 1.0f; x *= 1.0137f) {
        double want = tanh((double)x);
        double err = fabs((double)kiln_tanhf(-x) + want) / want;
        if (err > worst) worst = err;
    }
    cr_expect(worst < 5e-7, "worst relative error below 1: %g", worst);
    /* where tanh rounds to +-1 in float, exactly that */
    for (float x = 9.02f; x < 1e30f; x *= 1.5f) {
        cr_expect_eq(kiln_tanhf(x), 1.0f, "tanh(%g)", (double)x);
        cr_expect_eq(kiln_tanhf(-x), -1.0f, "tanh(%g)", (double)-x);
    }
    cr_expect(isnan(kiln_tanhf(NAN)));
    cr_expect_eq(kiln_tanhf(INFINITY), 1.0f);
    cr_expect_eq(kiln_tanhf(-INFINITY), -1.0f);
    cr_expect_eq(kiln_tanhf(1e-30f), 1e-30f);
    cr_expect(signbit(kiln_tanhf(-0.0f)));
}
