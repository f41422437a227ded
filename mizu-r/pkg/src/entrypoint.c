/* The Rust static library (crate mizu-r) registers the native routines; R calls this init
 * function, which forwards to it (the reference also keeps the linker from dropping the
 * library). */
#include <R.h>
#include <Rinternals.h>
#include <R_ext/Rdynload.h>

void R_init_mizu_extendr(void *dll);
/* R's user-supplied RNG hook lives in the Rust library; R finds it by name. */
double *user_unif_rand(void);
void *mizu_keep_user_unif_rand = (void *) &user_unif_rand;

void R_init_mizu(DllInfo *dll) {
    R_init_mizu_extendr(dll);
    /* RNGkind("user-supplied") looks `user_unif_rand` up by name in loaded libraries. */
    R_useDynamicSymbols(dll, TRUE);
}
