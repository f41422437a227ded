/* The packages a task uses, as `future` finds them: a name that an expression or a function it
 * calls reads, that is bound neither where the code was written nor in the global environment,
 * and that this session finds in a package attached after the global environment (`.N` and
 * `fread` of data.table, `%>%`, dplyr's `filter`). A task that uses such a package lists
 * with it every such package the caller has attached, in the order of its search path; the
 * worker makes its own search path agree before the task runs (see mizu_attach_packages).
 * R's default packages and mizu, which every worker attaches at start, are not listed, nor is
 * an environment attached under a package's name that is not an installed package
 * (`attach(list(...), name = ...)`).
 *
 * The caller looks each name up along its search path once: the answer is kept per symbol for
 * as long as the search path is the one it was found on (`library()` and `detach()` change it,
 * and start the answers afresh). */
#include <R.h>
#include <Rinternals.h>
#include <stdint.h>
#include <stdio.h>
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

/* What a task that uses a package lists: every listed package this session has attached, in
 * the order of its search path (made once per search path, preserved until it changes). */
static SEXP search_names = NULL;

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
    if (search_names != NULL) {
        R_ReleaseObject(search_names);
        search_names = NULL;
    }
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

/* The name of the package whose environment `e` is ("x" of "package:x"), or NULL. */
static const char *package_name(SEXP e) {
    SEXP name = R_PackageEnvName(e);
    if (TYPEOF(name) != STRSXP || XLENGTH(name) < 1) return NULL;
    const char *s = CHAR(STRING_ELT(name, 0));
    return strncmp(s, "package:", 8) == 0 ? s + 8 : NULL;
}

SEXP mizu_packages_names(const mizu_packages *p) {
    if (p->n == 0) return R_NilValue;
    if (search_names == NULL) {
        int n = 0;
        for (SEXP e = ENCLOS(R_GlobalEnv); e != R_EmptyEnv && TYPEOF(e) == ENVSXP; e = ENCLOS(e))
            if (listed(e)) n++;
        SEXP v = PROTECT(allocVector(STRSXP, n));
        n = 0;
        for (SEXP e = ENCLOS(R_GlobalEnv); e != R_EmptyEnv && TYPEOF(e) == ENVSXP; e = ENCLOS(e))
            if (listed(e)) SET_STRING_ELT(v, n++, mkChar(package_name(e)));
        R_PreserveObject(v);
        search_names = v;
        UNPROTECT(1);
    }
    /* One character vector (the compact encoding takes it as it is): the task's, NA, the
     * session's. */
    R_xlen_t n = XLENGTH(search_names);
    SEXP out = PROTECT(allocVector(STRSXP, p->n + 1 + n));
    for (int i = 0; i < p->n; i++) SET_STRING_ELT(out, i, mkChar(package_name(p->envs[i])));
    SET_STRING_ELT(out, p->n, NA_STRING);
    for (R_xlen_t i = 0; i < n; i++) SET_STRING_ELT(out, p->n + 1 + i, STRING_ELT(search_names, i));
    UNPROTECT(1);
    return out;
}

/* Whether the package `pkg` (a CHARSXP) is attached in this process. */
static int attached(SEXP pkg) {
    for (SEXP e = ENCLOS(R_GlobalEnv); e != R_EmptyEnv && TYPEOF(e) == ENVSXP; e = ENCLOS(e)) {
        const char *s = package_name(e);
        if (s != NULL && strcmp(s, CHAR(pkg)) == 0) return 1;
    }
    return 0;
}

/* Where `name` is in `v` (a character vector), or -1. */
static int position(SEXP v, const char *name) {
    for (R_xlen_t i = 0; i < XLENGTH(v); i++)
        if (strcmp(CHAR(STRING_ELT(v, i)), name) == 0) return (int) i;
    return -1;
}

/* The packages this worker had attached before its first task that listed packages: its
 * own (R's default packages, mizu, what `init` attached), which stay. */
static SEXP own = NULL;

static void note_own(void) {
    if (own != NULL) return;
    int n = 0;
    for (SEXP e = ENCLOS(R_GlobalEnv); e != R_EmptyEnv && TYPEOF(e) == ENVSXP; e = ENCLOS(e))
        if (package_name(e) != NULL) n++;
    SEXP v = PROTECT(allocVector(STRSXP, n));
    n = 0;
    for (SEXP e = ENCLOS(R_GlobalEnv); e != R_EmptyEnv && TYPEOF(e) == ENVSXP; e = ENCLOS(e))
        if (package_name(e) != NULL) SET_STRING_ELT(v, n++, mkChar(package_name(e)));
    R_PreserveObject(v);
    own = v;
    UNPROTECT(1);
}

/* Detaches the package `name` (its namespace stays loaded); nothing if R refuses (another
 * attached package depends on it). */
static void detach_package(const char *name) {
    char full[512];
    snprintf(full, sizeof full, "package:%s", name);
    SEXP call = PROTECT(lang3(install("detach"), mkString(full), ScalarLogical(TRUE)));
    SET_TAG(CDDR(call), install("character.only"));
    int failed = 0;
    R_tryEvalSilent(call, R_BaseEnv, &failed);
    UNPROTECT(1);
}

/* The first package attached here, before the task runs, that is not this worker's own and
 * that the caller's search path (`search`) has not or has in another order than the ones
 * after it here; NULL when every one is where the caller has it. */
static const char *stranger(SEXP search) {
    int last = -1;
    for (SEXP e = ENCLOS(R_GlobalEnv); e != R_EmptyEnv && TYPEOF(e) == ENVSXP; e = ENCLOS(e)) {
        const char *s = package_name(e);
        if (s == NULL) continue;
        int at = position(search, s);
        if (at < 0) {
            if (position(own, s) < 0) return s;
            continue;
        }
        /* Attached here in another order than the caller's (e.g. one attached for an earlier
         * task ahead of one the caller finds first): the first of the two goes, and is
         * attached again below if this task lists it. */
        if (at < last) return s;
        last = at;
    }
    return NULL;
}

/* Attaches `pkg` at position `pos` of the search path (2: right after the global
 * environment); `must`: a failure is the task's error, else it is let be. */
static void attach_package(SEXP pkg, int pos, int must) {
    SEXP lib = PROTECT(lang5(install("library"), ScalarString(pkg), ScalarLogical(TRUE),
                             ScalarLogical(FALSE), ScalarInteger(pos)));
    SET_TAG(CDDR(lib), install("character.only"));
    SET_TAG(CDR(CDDR(lib)), install("warn.conflicts"));
    SET_TAG(CDR(CDR(CDDR(lib))), install("pos"));
    SEXP call = PROTECT(lang2(install("suppressPackageStartupMessages"), lib));
    if (must) {
        eval(call, R_BaseEnv);
    } else {
        int failed = 0;
        R_tryEvalSilent(call, R_BaseEnv, &failed);
    }
    UNPROTECT(2);
}

/* Where in the search path the package at `at` of the caller's `search` goes: after every
 * package attached here that the caller has ahead of it. */
static int place_of(SEXP search, int at) {
    int i = 2, pos = 2;
    for (SEXP e = ENCLOS(R_GlobalEnv); e != R_EmptyEnv && TYPEOF(e) == ENVSXP;
         e = ENCLOS(e), i++) {
        const char *s = package_name(e);
        if (s == NULL) continue;
        int p = position(search, s);
        if (p >= 0 && p < at) pos = i + 1;
    }
    return pos;
}

/* On a worker, before a task that uses a package runs: `pkgs` lists the packages the task
 * uses, then NA, then those the caller's session has attached, in the order of its search
 * path; the worker's search path is made to agree with the session's. A
 * package an earlier task attached that the session has not (any more), or that sits ahead of
 * one the session finds first, is detached, so that a name the task uses finds here what it
 * finds in the session (purrr's `transpose`, not data.table's attached for an earlier task);
 * packages the worker attached itself (`init`) stay. Then the session's packages it lacks are
 * attached where the session has them, as library() does, without start-up messages or the
 * report of what they mask (the session printed both). A package the task uses that cannot
 * be attached fails the task with library()'s error; another (one the session loaded from
 * elsewhere, say) is let be. */
SEXP mizu_attach_packages(SEXP pkgs) {
    if (TYPEOF(pkgs) != STRSXP) error("mizu: a task's packages are not a character vector");
    R_xlen_t k = 0;
    while (k < XLENGTH(pkgs) && STRING_ELT(pkgs, k) != NA_STRING) k++;
    if (k == XLENGTH(pkgs)) error("mizu: a task's packages do not list the caller's");
    SEXP used = PROTECT(allocVector(STRSXP, k));
    for (R_xlen_t i = 0; i < k; i++) SET_STRING_ELT(used, i, STRING_ELT(pkgs, i));
    SEXP search = PROTECT(allocVector(STRSXP, XLENGTH(pkgs) - k - 1));
    for (R_xlen_t i = k + 1; i < XLENGTH(pkgs); i++)
        SET_STRING_ELT(search, i - k - 1, STRING_ELT(pkgs, i));
    note_own();
    const char *s;
    /* (Each round detaches one package: at most as many rounds as are attached.) */
    for (int round = 0; round < 256 && (s = stranger(search)) != NULL; round++) {
        char name[256];
        snprintf(name, sizeof name, "%s", s);
        detach_package(name);
        if (attached(mkChar(name))) break; /* R would not: leave the rest as it is */
    }
    for (R_xlen_t i = 0; i < XLENGTH(search); i++) {
        SEXP pkg = STRING_ELT(search, i);
        if (pkg == NA_STRING || attached(pkg)) continue;
        attach_package(pkg, place_of(search, (int) i), position(used, CHAR(pkg)) >= 0);
    }
    /* (A package the task uses is on the session's search path: this is for a malformed
     * message, which gets library()'s error for what it names.) */
    for (R_xlen_t i = 0; i < XLENGTH(used); i++) {
        SEXP pkg = STRING_ELT(used, i);
        if (pkg != NA_STRING && !attached(pkg)) attach_package(pkg, 2, 1);
    }
    UNPROTECT(2);
    return R_NilValue;
}
