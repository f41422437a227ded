/* The packages a task uses (see packages.c). */
#ifndef MIZU_PACKAGES_H
#define MIZU_PACKAGES_H

#include <Rinternals.h>

#define MIZU_PACKAGES_MAX 32

/* The packages found for a task so far: their environments on the search path (kept alive by
 * it while the task's message is made). */
typedef struct {
    SEXP envs[MIZU_PACKAGES_MAX];
    int n;
} mizu_packages;

/* Before names are looked up for a message: starts the kept answers afresh if the search
 * path changed since they were found. */
void mizu_packages_check_search(void);

/* Adds to `p` (if not NULL) the listed package `sym` is found in, if any. */
void mizu_packages_note(SEXP sym, mizu_packages *p);

/* R_NilValue when `p` has no package; else the names of `p`'s packages, NA, and the names of
 * the listed packages this session has attached, in the order of its search path.
 * Unprotected. */
SEXP mizu_packages_names(const mizu_packages *p);

/* .Call entry: makes a worker's search path agree with the caller's packages `pkgs`. */
SEXP mizu_attach_packages(SEXP pkgs);

#endif
