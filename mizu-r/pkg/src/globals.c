/* A task's globals: the caller's variables an expression task (or a map's function) uses
 * without a binding of its own, and their binding on the worker.
 *
 * The caller's side runs at every submit of such an expression: codetools finds the free
 * names of an expression or of a function's code once, the package keeps them (`.maps` in the
 * namespace, filled by .expr_names() and .free_names() in R), and the rest — the cache
 * lookups, where each name is found, the values, the global functions' own globals in turn —
 * is the C below. As R code it took two thirds of the caller's time of a `sq(i)` submit.
 *
 * The worker's side binds a task's globals in its global environment while the task runs. */
#include <R.h>
#include <Rinternals.h>
#include <limits.h>
#include <string.h>

#include "packages.h"

/* identical()'s defaults: closures' environments compared, bytecode and srcrefs not. */
#define IDENTICAL_DEFAULT 16

/* A growing named list (or, with values left NULL, a set of names), protected while it grows.
 * Its vectors are made at the first push (most functions have no globals), `cap` long: the
 * most it is expected to hold, so that a list that ends up full is used as it is (each
 * allocation is a good part of a submit's time). */
typedef struct {
    SEXP names, values;
    R_xlen_t n, cap;
    PROTECT_INDEX pn, pv;
} bindings;

/* Two protections: UNPROTECT(2) releases them. */
static void bindings_init(bindings *b, R_xlen_t cap) {
    b->n = 0;
    b->cap = cap < 1 ? 1 : cap;
    PROTECT_WITH_INDEX(b->names = R_NilValue, &b->pn);
    PROTECT_WITH_INDEX(b->values = R_NilValue, &b->pv);
}

/* `value` must be protected (or reachable) by the caller: growing allocates. */
static void bindings_push(bindings *b, SEXP name, SEXP value) {
    if (b->names == R_NilValue) {
        REPROTECT(b->names = allocVector(STRSXP, b->cap), b->pn);
        REPROTECT(b->values = allocVector(VECSXP, b->cap), b->pv);
    } else if (b->n == XLENGTH(b->names)) {
        R_xlen_t cap = 2 * b->n;
        REPROTECT(b->names = xlengthgets(b->names, cap), b->pn);
        REPROTECT(b->values = xlengthgets(b->values, cap), b->pv);
    }
    SET_STRING_ELT(b->names, b->n, name);
    SET_VECTOR_ELT(b->values, b->n, value);
    b->n++;
}

static int same_string(SEXP a, SEXP b) {
    return a == b || strcmp(CHAR(a), CHAR(b)) == 0;
}

/* Whether `s` (a CHARSXP) is among the first `n` elements of the character vector `v`. */
static int among(SEXP s, SEXP v, R_xlen_t n) {
    for (R_xlen_t i = 0; i < n; i++)
        if (same_string(STRING_ELT(v, i), s)) return 1;
    return 0;
}

/* The value bound to `sym` in the frame of `env`, a promise forced (as get() does). */
static SEXP frame_value(SEXP env, SEXP sym) {
    SEXP v = findVarInFrame3(env, sym, TRUE);
    if (v == R_UnboundValue) error("object '%s' not found", CHAR(PRINTNAME(sym)));
    if (TYPEOF(v) == PROMSXP) {
        PROTECT(v);
        v = eval(v, env);
        UNPROTECT(1);
    }
    return v;
}

/* One of the package's caches of free names: a list of list(key, names). */
static SEXP cache(SEXP ns, const char *which) {
    SEXP maps = findVarInFrame3(ns, install(".maps"), TRUE);
    if (TYPEOF(maps) == PROMSXP) maps = eval(maps, ns); /* (lazy-loaded) */
    if (TYPEOF(maps) != ENVSXP) error("mizu: internal error: the package's caches are missing");
    SEXP entries = findVarInFrame3(maps, install(which), TRUE);
    return TYPEOF(entries) == VECSXP ? entries : R_NilValue;
}

/* codetools::findGlobals() of the expression `expr`: kept, or found (and kept) by
 * .expr_names(). The result is reachable from the cache; callers protect it all the same. */
static SEXP expr_names(SEXP expr, SEXP ns) {
    SEXP entries = cache(ns, "exprs");
    R_xlen_t n = entries == R_NilValue ? 0 : XLENGTH(entries);
    for (R_xlen_t i = 0; i < n; i++) {
        SEXP e = VECTOR_ELT(entries, i);
        if (TYPEOF(e) == VECSXP && XLENGTH(e) == 2 &&
            R_compute_identical(VECTOR_ELT(e, 0), expr, IDENTICAL_DEFAULT))
            return VECTOR_ELT(e, 1);
    }
    SEXP quoted = PROTECT(lang2(install("quote"), expr));
    SEXP call = PROTECT(lang2(install(".expr_names"), quoted));
    SEXP nm = eval(call, ns);
    UNPROTECT(2);
    return nm;
}

/* codetools::findGlobals() of the closure `f`, kept by its code (body and formals), or found
 * (and kept) by .free_names(). */
static SEXP free_names(SEXP f, SEXP ns) {
    SEXP entries = cache(ns, "globals");
    R_xlen_t n = entries == R_NilValue ? 0 : XLENGTH(entries);
    SEXP body = PROTECT(R_ClosureExpr(f));
    for (R_xlen_t i = 0; i < n; i++) {
        SEXP e = VECTOR_ELT(entries, i);
        if (TYPEOF(e) != VECSXP || XLENGTH(e) != 2) continue;
        SEXP key = VECTOR_ELT(e, 0);
        if (TYPEOF(key) == VECSXP && XLENGTH(key) == 2 &&
            R_compute_identical(VECTOR_ELT(key, 0), body, IDENTICAL_DEFAULT) &&
            R_compute_identical(VECTOR_ELT(key, 1), FORMALS(f), IDENTICAL_DEFAULT)) {
            UNPROTECT(1);
            return VECTOR_ELT(e, 1);
        }
    }
    SEXP call = PROTECT(lang2(install(".free_names"), f));
    SEXP nm = eval(call, ns);
    UNPROTECT(2);
    return nm;
}

/* Where `sym`, looked up from `env`, is found: FOUND_BEFORE (in an environment before the
 * global one, or nowhere on a chain that does not reach it), FOUND_GLOBAL, or PAST_GLOBAL (not
 * up to and including the global environment: in an attached package or base, if anywhere). */
enum { FOUND_BEFORE, FOUND_GLOBAL, PAST_GLOBAL };
static int resolves_to_global(SEXP sym, SEXP env) {
    while (env != R_GlobalEnv) {
        if (env == R_EmptyEnv || TYPEOF(env) != ENVSXP || R_existsVarInFrame(env, sym))
            return FOUND_BEFORE;
        env = ENCLOS(env);
    }
    return R_existsVarInFrame(R_GlobalEnv, sym) ? FOUND_GLOBAL : PAST_GLOBAL;
}

/* The global names of the function `f`, added to `acc` (also the names already seen): the
 * free names of its code that resolve, from its environment, to the global environment —
 * which R's serialization does not carry (an enclosing function's environment travels with
 * the closure) — and in turn those of the global functions among them. The packages of those
 * found past the global environment go to `pk` (see packages.c). */
static void global_names(SEXP f, SEXP ns, bindings *acc, mizu_packages *pk) {
    SEXP env = CLOENV(f);
    SEXP nm = PROTECT(free_names(f, ns));
    R_xlen_t n = TYPEOF(nm) == STRSXP ? XLENGTH(nm) : 0;
    R_xlen_t start = acc->n;
    for (R_xlen_t i = 0; i < n; i++) {
        SEXP s = STRING_ELT(nm, i);
        SEXP sym = installTrChar(s);
        int where = env == R_GlobalEnv
                        ? (R_existsVarInFrame(R_GlobalEnv, sym) ? FOUND_GLOBAL : PAST_GLOBAL)
                        : resolves_to_global(sym, env);
        if (where == FOUND_GLOBAL && !among(s, acc->names, acc->n))
            bindings_push(acc, s, R_NilValue);
        else if (where == PAST_GLOBAL)
            mizu_packages_note(sym, pk);
    }
    R_xlen_t end = acc->n;
    for (R_xlen_t i = start; i < end; i++) {
        SEXP v = PROTECT(frame_value(R_GlobalEnv, installTrChar(STRING_ELT(acc->names, i))));
        if (TYPEOF(v) == CLOSXP) global_names(v, ns, acc, pk);
        UNPROTECT(1);
    }
    UNPROTECT(1);
}

/* The environment `sym` is found in from `env` when that is the global environment or a
 * function's frame; NULL when it is found first in a package's namespace, its imports or base
 * (which package code, or code run in a namespace as tests are, reaches before the global
 * environment), in a package on the search path after it, or nowhere. `*past` is set when
 * the walk passed the global environment without finding it (a package's or base's name, if
 * anything's). */
static SEXP global_frame_of(SEXP sym, SEXP env, int *past) {
    int in_package = 0;
    *past = 0;
    for (;;) {
        if (env == R_EmptyEnv || env == R_BaseEnv || TYPEOF(env) != ENVSXP) return NULL;
        if (env == R_BaseNamespace || R_IsNamespaceEnv(env)) in_package = 1;
        if (R_existsVarInFrame(env, sym)) return env == R_GlobalEnv || !in_package ? env : NULL;
        if (env == R_GlobalEnv) {
            *past = 1;
            return NULL;
        }
        env = ENCLOS(env);
    }
}

/* list(a, b, c), unnamed. */
static SEXP list_of3(SEXP a, SEXP b, SEXP c) {
    SEXP v = PROTECT(allocVector(VECSXP, 3));
    SET_VECTOR_ELT(v, 0, a);
    SET_VECTOR_ELT(v, 1, b);
    SET_VECTOR_ELT(v, 2, c);
    UNPROTECT(1);
    return v;
}

/* The bindings as a named list. */
static SEXP named_list(bindings *b) {
    if (b->n == 0) return allocVector(VECSXP, 0);
    if (b->n == XLENGTH(b->values)) {
        setAttrib(b->values, R_NamesSymbol, b->names);
        return b->values;
    }
    SEXP out = PROTECT(xlengthgets(b->values, b->n));
    setAttrib(out, R_NamesSymbol, xlengthgets(b->names, b->n));
    UNPROTECT(1);
    return out;
}

/* Adds to `glob` the global names of `v`, if it is a function (see global_names()), with
 * their values in the global environment, unless `glob` has them already; sets `*closures`
 * when `v` finds variables in the global environment (its own, or through the frame of the
 * function that made it), which it will find in the worker's. A function whose environment is
 * the global one but whose code finds nothing there (`sq <- function(x) x * x`) does not set
 * it: where such a function is bound on the worker changes nothing it finds, so it travels
 * among the expression's bindings, the cheaper message. */
static void function_globals_into(SEXP v, SEXP ns, bindings *glob, int *closures,
                                  mizu_packages *pk) {
    if (TYPEOF(v) != CLOSXP) return;
    bindings more;
    bindings_init(&more, 4);
    global_names(v, ns, &more, pk);
    if (more.n > 0) *closures = 1;
    for (R_xlen_t j = 0; j < more.n; j++) {
        SEXP s = STRING_ELT(more.names, j);
        if (among(s, glob->names, glob->n)) continue;
        SEXP value = PROTECT(frame_value(R_GlobalEnv, installTrChar(s)));
        bindings_push(glob, s, value);
        UNPROTECT(1);
    }
    UNPROTECT(2);
}

/* The globals of the expression `expr` written in `env`, with the bindings `vars` (a named
 * list) given for it: the names codetools finds in `expr` that `vars` does not bind and that
 * resolve from `env` to the global environment or a function's frame (not to a package), with
 * their values, then the global names of the functions among those and among `vars` (as for
 * a map's function). Those found in the global environment go to `glob`, those found in a
 * function's frame to `loc` (both initialized by the caller, empty): a function's own globals
 * are always its global environment's, even where the expression sees a variable or binding
 * of the same name. `*closures` is set when a function among them finds variables in the
 * global environment. `ns` is the package's namespace. */
static void expr_globals(SEXP expr, SEXP vars, SEXP env, SEXP ns, int *closures,
                         bindings *glob, bindings *loc, mizu_packages *pk) {
    if (TYPEOF(env) != ENVSXP || TYPEOF(ns) != ENVSXP || TYPEOF(vars) != VECSXP)
        error("mizu: internal error: bad arguments to expr_globals");
    SEXP bound = PROTECT(getAttrib(vars, R_NamesSymbol));
    R_xlen_t nb = TYPEOF(bound) == STRSXP ? XLENGTH(bound) : 0;
    SEXP names = PROTECT(expr_names(expr, ns));
    R_xlen_t n = TYPEOF(names) == STRSXP ? XLENGTH(names) : 0;
    if (n > glob->cap) glob->cap = n; /* (nothing pushed yet: the first push allocates) */
    for (R_xlen_t i = 0; i < n; i++) {
        SEXP s = STRING_ELT(names, i);
        if (among(s, bound, nb)) continue;
        SEXP sym = installTrChar(s);
        int past;
        SEXP frame = global_frame_of(sym, env, &past);
        if (frame == NULL) {
            if (past) mizu_packages_note(sym, pk);
            continue;
        }
        SEXP value = PROTECT(frame_value(frame, sym));
        bindings_push(frame == R_GlobalEnv ? glob : loc, s, value);
        UNPROTECT(1);
    }
    *closures = 0;
    /* (A push may replace glob's vectors: the element is read again each time.) */
    R_xlen_t direct = glob->n;
    for (R_xlen_t i = 0; i < direct; i++)
        function_globals_into(VECTOR_ELT(glob->values, i), ns, glob, closures, pk);
    for (R_xlen_t i = 0; i < loc->n; i++)
        function_globals_into(VECTOR_ELT(loc->values, i), ns, glob, closures, pk);
    for (R_xlen_t i = 0; i < XLENGTH(vars); i++)
        function_globals_into(VECTOR_ELT(vars, i), ns, glob, closures, pk);
    UNPROTECT(2);
}

/* NULL when nothing in `values` is an environment or an external pointer, else the failure
 * c(class, message) naming the global (see `sendable.rs`). */
SEXP mizu_rs_check_globals(SEXP values);

/* The named list `vars` with the bindings `a` and `b` (either may be NULL) after it, made in
 * one piece (each list and names attribute made is a good part of a submit's time); `vars`
 * itself when there are none. */
static SEXP appended(SEXP vars, bindings *a, bindings *b) {
    R_xlen_t na = a ? a->n : 0, nbind = b ? b->n : 0, nv = XLENGTH(vars);
    if (na == 0 && nbind == 0) return vars;
    R_xlen_t n = nv + na + nbind;
    SEXP all = PROTECT(allocVector(VECSXP, n));
    SEXP names = PROTECT(allocVector(STRSXP, n));
    SEXP nm = getAttrib(vars, R_NamesSymbol);
    for (R_xlen_t i = 0; i < nv; i++) {
        SET_VECTOR_ELT(all, i, VECTOR_ELT(vars, i));
        SET_STRING_ELT(names, i, TYPEOF(nm) == STRSXP ? STRING_ELT(nm, i) : R_BlankString);
    }
    R_xlen_t at = nv;
    bindings *parts[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        if (parts[k] == NULL) continue;
        for (R_xlen_t i = 0; i < parts[k]->n; i++, at++) {
            SET_VECTOR_ELT(all, at, VECTOR_ELT(parts[k]->values, i));
            SET_STRING_ELT(names, at, STRING_ELT(parts[k]->names, i));
        }
    }
    setAttrib(all, R_NamesSymbol, names);
    UNPROTECT(2);
    return all;
}

/* Raises the failure (.raise_failure()) of a global in `values` (a named list, or NULL) that
 * cannot be sent. */
static void check_globals(SEXP values, SEXP ns) {
    if (values == R_NilValue) return;
    SEXP failure = PROTECT(mizu_rs_check_globals(values));
    if (failure != R_NilValue) {
        SEXP call = PROTECT(lang2(install(".raise_failure"), failure));
        eval(call, ns);
        UNPROTECT(1);
    }
    UNPROTECT(1);
}

/* check_globals() of the bindings `b`: their values are checked as they are (unnamed, maybe
 * with empty slots after them), and named only to say which global fails. */
static void check_bindings(bindings *b, SEXP ns) {
    if (b->n == 0 || mizu_rs_check_globals(b->values) == R_NilValue) return;
    check_globals(PROTECT(named_list(b)), ns);
    UNPROTECT(1); /* (not reached: check_globals() raises) */
}

/* An expression task's message: list("e", expr, vars), with the globals `expr` uses (found
 * from `env`, where it was written; see expr_globals()) among the bindings. When a function
 * among them, or among `vars`, finds its own globals in the global environment, the globals
 * found there go as a fourth element instead, bound in the worker's global environment while
 * the task runs (those found in a function's frame stay among the bindings, which only the
 * expression sees). The packages they use (packages.c) go as a fifth, after a NULL fourth
 * when there are no such globals, with those this session has attached: the worker's search
 * path is made to agree with them. A global that cannot
 * be sent raises its failure (.raise_failure()). */
SEXP mizu_expr_message_in(SEXP expr, SEXP vars, SEXP env, SEXP ns) {
    if (TYPEOF(vars) != VECSXP) error("mizu: internal error: a task's bindings are not a list");
    /* (The kind is one vector for every message: nothing changes a message's elements.) */
    static SEXP kind = NULL;
    if (kind == NULL) {
        SEXP k = mkString("e");
        R_PreserveObject(k);
        kind = k;
    }
    int closures = 0;
    mizu_packages pk = {.n = 0};
    mizu_packages_check_search();
    bindings glob, loc;
    bindings_init(&glob, 1);
    bindings_init(&loc, 1);
    expr_globals(expr, vars, env, ns, &closures, &glob, &loc, &pk);
    check_bindings(&glob, ns);
    check_bindings(&loc, ns);
    SEXP pkgs = PROTECT(mizu_packages_names(&pk));
    int apart = closures && glob.n > 0;
    SEXP msg = PROTECT(allocVector(VECSXP, pkgs != R_NilValue ? 5 : apart ? 4 : 3));
    if (apart) {
        SET_VECTOR_ELT(msg, 2, appended(vars, &loc, NULL));
        SET_VECTOR_ELT(msg, 3, named_list(&glob));
    } else {
        SET_VECTOR_ELT(msg, 2, appended(vars, &loc, &glob));
    }
    if (pkgs != R_NilValue) SET_VECTOR_ELT(msg, 4, pkgs);
    SET_VECTOR_ELT(msg, 0, kind);
    SET_VECTOR_ELT(msg, 1, expr);
    UNPROTECT(6);
    return msg;
}

/* The package namespace, looked up each time rather than kept (a reloaded package gets its
 * new one). */
static SEXP mizu_ns(void) {
    SEXP name = PROTECT(mkString("mizu"));
    SEXP ns = R_FindNamespace(name);
    UNPROTECT(1);
    return ns;
}

/* .expr_message(expr, vars, env): see mizu_expr_message_in(). */
SEXP mizu_expr_message(SEXP expr, SEXP vars, SEXP env) {
    SEXP ns = PROTECT(mizu_ns());
    SEXP msg = mizu_expr_message_in(expr, vars, env, ns);
    UNPROTECT(1);
    return msg;
}

/* The globals of a map's function `f` — or of the functions among `f`, a list (a map's
 * function and its extra arguments) — as a named list: their global names (see
 * global_names()) with their values in the global environment; an empty list when there are
 * none. The packages they use (packages.c) are its "packages" attribute, if any. */
SEXP mizu_function_globals(SEXP f) {
    SEXP ns = PROTECT(mizu_ns());
    bindings acc;
    bindings_init(&acc, 4);
    mizu_packages pk = {.n = 0};
    mizu_packages_check_search();
    if (TYPEOF(f) == CLOSXP) global_names(f, ns, &acc, &pk);
    else if (TYPEOF(f) == VECSXP)
        for (R_xlen_t i = 0; i < XLENGTH(f); i++)
            if (TYPEOF(VECTOR_ELT(f, i)) == CLOSXP)
                global_names(VECTOR_ELT(f, i), ns, &acc, &pk);
    for (R_xlen_t i = 0; i < acc.n; i++)
        SET_VECTOR_ELT(acc.values, i,
                       frame_value(R_GlobalEnv, installTrChar(STRING_ELT(acc.names, i))));
    SEXP out = PROTECT(named_list(&acc));
    SEXP pkgs = PROTECT(mizu_packages_names(&pk));
    if (pkgs != R_NilValue) setAttrib(out, install("packages"), pkgs);
    UNPROTECT(5);
    return out;
}

/* The position (from 1) of the first of `entries` — a list of list(key, value) — whose key is
 * identical() to `key`, or 0: the lookup .expr_names() and .free_names() make before they
 * ask codetools. */
SEXP mizu_find_identical(SEXP entries, SEXP key) {
    if (TYPEOF(entries) != VECSXP) error("mizu: internal error: a cache is not a list");
    R_xlen_t n = XLENGTH(entries);
    for (R_xlen_t i = 0; i < n; i++) {
        SEXP e = VECTOR_ELT(entries, i);
        if (TYPEOF(e) == VECSXP && XLENGTH(e) == 2 &&
            R_compute_identical(VECTOR_ELT(e, 0), key, IDENTICAL_DEFAULT))
            return ScalarInteger(i < INT_MAX ? (int) (i + 1) : 0);
    }
    return ScalarInteger(0);
}

/* The worker's side. A task's globals (the fourth element of its message, see
 * .expr_message()) are bound in the worker's global environment while it runs, where the
 * global functions among them find one another. mizu_bind_globals() binds the named values of
 * `globals` there and returns what they replaced — list(symbols, old values, whether each had
 * one) — for mizu_unbind_globals() to put back when the task ends. As R calls (exists, mget,
 * list2env, rm) the two took ~30 us per task. A locked binding fails the task before anything
 * is bound; a promise that a global replaces is put back unforced. */
SEXP mizu_bind_globals(SEXP globals) {
    if (TYPEOF(globals) != VECSXP) error("mizu: internal error: a task's globals are not a list");
    R_xlen_t n = XLENGTH(globals);
    SEXP names = getAttrib(globals, R_NamesSymbol);
    if (n > 0 && (TYPEOF(names) != STRSXP || XLENGTH(names) != n))
        error("mizu: internal error: a task's globals are not named");
    SEXP syms = PROTECT(allocVector(VECSXP, n));
    SEXP old = PROTECT(allocVector(VECSXP, n));
    SEXP had = PROTECT(allocVector(LGLSXP, n));
    for (R_xlen_t i = 0; i < n; i++) {
        SEXP sym = installTrChar(STRING_ELT(names, i));
        SET_VECTOR_ELT(syms, i, sym);
        int exists = R_existsVarInFrame(R_GlobalEnv, sym);
        LOGICAL(had)[i] = exists;
        if (!exists) continue;
        if (R_BindingIsLocked(sym, R_GlobalEnv))
            error("the global `%s` the task uses is locked in the worker's global environment",
                  CHAR(PRINTNAME(sym)));
        SET_VECTOR_ELT(old, i, findVarInFrame3(R_GlobalEnv, sym, FALSE));
    }
    for (R_xlen_t i = 0; i < n; i++)
        defineVar(VECTOR_ELT(syms, i), VECTOR_ELT(globals, i), R_GlobalEnv);
    SEXP out = list_of3(syms, old, had);
    UNPROTECT(3);
    return out;
}

/* Puts back what mizu_bind_globals() replaced: each old binding, or none. */
SEXP mizu_unbind_globals(SEXP bound) {
    if (TYPEOF(bound) != VECSXP || XLENGTH(bound) != 3)
        error("mizu: internal error: bad globals to unbind");
    SEXP syms = VECTOR_ELT(bound, 0), old = VECTOR_ELT(bound, 1), had = VECTOR_ELT(bound, 2);
    R_xlen_t n = XLENGTH(syms);
    for (R_xlen_t i = 0; i < n; i++) {
        SEXP sym = VECTOR_ELT(syms, i);
        if (LOGICAL(had)[i])
            defineVar(sym, VECTOR_ELT(old, i), R_GlobalEnv);
        else if (R_existsVarInFrame(R_GlobalEnv, sym))
            R_removeVarFromFrame(sym, R_GlobalEnv);
    }
    return R_NilValue;
}
