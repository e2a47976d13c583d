/* rng.h — the compiler's view of the counter-based generator. It is defined once, in the
 * runtime's header, because generated programs must produce bit-identical numbers. */
#ifndef KILN_UTIL_RNG_H
#define KILN_UTIL_RNG_H
#include "../runtime/kiln_rng.h"
#endif
