/* The packages a task uses, as `future` finds them: a name that an expression or a function it
 * calls reads, that is bound neither where the code was written nor in the global environment,
 * and that this session finds in a package attached after the global environment (`.N` and
 * `fread` of data.table, `%>%`, dplyr's `filter`). The caller lists those packages with the
 * task; the worker attaches the ones it lacks before the task runs. R's default packages and
 * mizu, which every worker attaches at start, are not listed, nor is an environment attached
 * under a package's name that is not an installed package (`attach(list(...), name = ...)`).
 *
 * The caller looks each name up along its search path once: the answer is kept per symbol for
 * as long as the search path is the one it was found on (`library()` and `detach()` change it,
 * and start the answers afresh). */
#include <R.h>
#include <Rinternals.h>
#include <stdint.h>
#include <string.h>

#include "packages.h"

/* The search path after the global environment, as last seen: each environment and its
 * "name" attribute (an environment freed and another made at its address gets a new one). */
#define SEARCH_MAX 256
static SEXP seen_env[SEARCH_MAX], seen_name[SEARCH_MAX];
static int seen_n = -1;

/* Per symbol (symbols live as long as the session), the package environment its name was
 * found in, or R_NilValue for none that is listed. Open addressing; a full run evicts. */
#define CACHE_SIZE 1024
#define CACHE_PROBES 8
static SEXP cache_sym[CACHE_SIZE], cache_env[CACHE_SIZE];

/* Starts the answers afresh when the search path is not the one they were found on. */
void mizu_packages_check_search(void) {
    int n = 0, same = 1;
    for (SEXP e = ENCLOS(R_GlobalEnv); e != R_EmptyEnv && TYPEOF(e) == ENVSXP; e = ENCLOS(e)) {
        SEXP name = getAttrib(e, R_NameSymbol);
        if (n >= SEARCH_MAX) {
            same = 0;
            break;
        }
        if (n >= seen_n || seen_env[n] != e || seen_name[n] != name) same = 0;
        seen_env[n] = e;
        seen_name[n] = name;
        n++;
    }
    if (same && n == seen_n) return;
    seen_n = n;
    memset(cache_sym, 0, sizeof cache_sym);
}

/* Whether the package environment `e` is one a task's list names: an installed package's
 * (it has a "path"), not one every worker attaches. */
static int listed(SEXP e) {
    static const char *const every_worker[] = {
        "package:stats", "package:graphics", "package:grDevices", "package:utils",
        "package:datasets", "package:methods", "package:mizu", NULL};
    SEXP name = R_PackageEnvName(e);
    if (TYPEOF(name) != STRSXP || XLENGTH(name) < 1) return 0;
    if (getAttrib(e, install("path")) == R_NilValue) return 0;
    const char *s = CHAR(STRING_ELT(name, 0));
    for (int i = 0; every_worker[i]; i++)
        if (strcmp(s, every_worker[i]) == 0) return 0;
    return 1;
}

/* The listed package environment `sym` is found in along the search path after the global
 * environment (base ends the walk), or R_NilValue. */
static SEXP package_env_of(SEXP sym) {
    uintptr_t h = ((uintptr_t) sym >> 4) & (CACHE_SIZE - 1);
    for (int k = 0; k < CACHE_PROBES; k++) {
        uintptr_t i = (h + k) & (CACHE_SIZE - 1);
        if (cache_sym[i] == sym) return cache_env[i];
        if (cache_sym[i] == NULL) break;
    }
    SEXP found = R_NilValue;
    for (SEXP e = ENCLOS(R_GlobalEnv); e != R_BaseEnv && e != R_EmptyEnv && TYPEOF(e) == ENVSXP;
         e = ENCLOS(e)) {
        if (R_existsVarInFrame(e, sym)) {
            if (listed(e)) found = e;
            break;
        }
    }
    uintptr_t at = h;
    for (int k = 0; k < CACHE_PROBES; k++) {
        uintptr_t i = (h + k) & (CACHE_SIZE - 1);
        if (cache_sym[i] == NULL) {
            at = i;
            break;
        }
    }
    cache_sym[at] = sym;
    cache_env[at] = found;
    return found;
}

void mizu_packages_note(SEXP sym, mizu_packages *p) {
    if (p == NULL) return;
    SEXP e = package_env_of(sym);
    if (e == R_NilValue) return;
    for (int i = 0; i < p->n; i++)
        if (p->envs[i] == e) return;
    if (p->n < MIZU_PACKAGES_MAX) p->envs[p->n++] = e;
}

SEXP mizu_packages_names(const mizu_packages *p) {
    if (p->n == 0) return R_NilValue;
    SEXP out = PROTECT(allocVector(STRSXP, p->n));
    for (int i = 0; i < p->n; i++) {
        const char *s = CHAR(STRING_ELT(R_PackageEnvName(p->envs[i]), 0));
        SET_STRING_ELT(out, i, mkChar(s + strlen("package:")));
    }
    UNPROTECT(1);
    return out;
}

/* Whether the package `pkg` (a CHARSXP) is attached in this process. */
static int attached(SEXP pkg) {
    const char *want = CHAR(pkg);
    for (SEXP e = ENCLOS(R_GlobalEnv); e != R_EmptyEnv && TYPEOF(e) == ENVSXP; e = ENCLOS(e)) {
        SEXP name = R_PackageEnvName(e);
        if (TYPEOF(name) == STRSXP && XLENGTH(name) >= 1) {
            const char *s = CHAR(STRING_ELT(name, 0));
            if (strncmp(s, "package:", 8) == 0 && strcmp(s + 8, want) == 0) return 1;
        }
    }
    return 0;
}

/* On a worker, before a task runs: attaches the packages of `pkgs` (a character vector) it
 * has not attached, as library() does, without its start-up messages or its report of what
 * the package masks (the caller's session printed both when it attached the package). A
 * package that cannot be attached fails the task with library()'s error. */
SEXP mizu_attach_packages(SEXP pkgs) {
    if (TYPEOF(pkgs) != STRSXP) error("mizu: a task's packages are not a character vector");
    for (R_xlen_t i = 0; i < XLENGTH(pkgs); i++) {
        SEXP pkg = STRING_ELT(pkgs, i);
        if (pkg == NA_STRING || attached(pkg)) continue;
        SEXP lib = PROTECT(lang4(install("library"), ScalarString(pkg), ScalarLogical(TRUE),
                                 ScalarLogical(FALSE)));
        SET_TAG(CDDR(lib), install("character.only"));
        SET_TAG(CDR(CDDR(lib)), install("warn.conflicts"));
        SEXP call = PROTECT(lang2(install("suppressPackageStartupMessages"), lib));
        eval(call, R_BaseEnv);
        UNPROTECT(2);
    }
    return R_NilValue;
}
