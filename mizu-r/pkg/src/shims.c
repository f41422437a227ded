/* The two calls every task makes, as .Call entry points that raise R conditions themselves.
 * The Rust routines they wrap return failures as values: an R error must not long-jump across
 * Rust frames. Here, with only C frames left, the package's R function for the failure is
 * called directly, which spares the R wrappers a test and a branch in interpreted code (the
 * wrappers' cost dominates a task's round trip). */
#include <R.h>
#include <Rinternals.h>
#include <limits.h>
#include <string.h>

SEXP mizu_rs_submit_expr(SEXP pool, SEXP expr, SEXP vars);
SEXP mizu_rs_submit_xcall(SEXP pool, SEXP call, SEXP vars);
SEXP mizu_rs_collect_value(SEXP task, SEXP timeout, int *outcome);

/* The package namespace, looked up each time rather than kept (a reloaded package gets its
 * new one): only failures, outcomes other than a plain value and submits that search for
 * globals come here. */
static SEXP mizu_namespace(void) {
    SEXP name = PROTECT(mkString("mizu"));
    SEXP ns = R_FindNamespace(name);
    UNPROTECT(1);
    return ns;
}

/* fun(arg), with fun looked up in the package namespace (where R forces a lazy-loaded
 * binding). */
static SEXP mizu_call1(const char *fun, SEXP arg) {
    SEXP ns = PROTECT(mizu_namespace());
    SEXP call = PROTECT(lang2(install(fun), arg));
    SEXP v = eval(call, ns);
    UNPROTECT(2);
    return v;
}

/* mizu_submit(): the task handle, or the failure `c(class, message)` raised. `frame` is
 * mizu_submit's own frame, where `.expr` is still a promise of the caller's expression. A
 * pool of another language's workers answers "mizu_foreign": its task is the value of that
 * expression (a mizu_call()), forced here and submitted as a cross-language call (no R
 * closure on this path: one costs more than the rest of the submit). An expression that may
 * use the caller's variables answers "mizu_globals", and .submit_globals() submits it with
 * them. */
SEXP mizu_submit_shim(SEXP pool, SEXP expr, SEXP vars, SEXP frame) {
    SEXP r = mizu_rs_submit_expr(pool, expr, vars);
    if (TYPEOF(r) != STRSXP) return r;
    PROTECT(r);
    if (XLENGTH(r) == 2 && strcmp(CHAR(STRING_ELT(r, 0)), "mizu_foreign") == 0) {
        if (TYPEOF(frame) != ENVSXP) {
            UNPROTECT(1);
            error("mizu: a pool of another language's workers runs mizu_call() tasks");
        }
        SEXP call = PROTECT(eval(install(".expr"), frame));
        SEXP t = mizu_rs_submit_xcall(pool, call, vars);
        UNPROTECT(2);
        if (TYPEOF(t) == STRSXP) {
            PROTECT(t);
            mizu_call1(".raise_failure", t);
            UNPROTECT(1);
        }
        return t;
    }
    if (XLENGTH(r) == 2 && strcmp(CHAR(STRING_ELT(r, 0)), "mizu_globals") == 0) {
        /* The expression may use variables of the caller's: .submit_globals() finds them
         * from where it was written and submits. That is the environment of mizu_submit's
         * `.expr` promise (unforced: only substituted), which .submit_globals() otherwise
         * asks parent.frame() for, from `frame`. */
        SEXP env = R_NilValue;
        if (TYPEOF(frame) == ENVSXP) {
            SEXP p = findVarInFrame3(frame, install(".expr"), TRUE);
            if (TYPEOF(p) == PROMSXP && TYPEOF(PRENV(p)) == ENVSXP) env = PRENV(p);
        }
        SEXP ns = PROTECT(mizu_namespace());
        SEXP quoted = PROTECT(lang2(install("quote"), expr));
        SEXP call = PROTECT(lang6(install(".submit_globals"), pool, vars, frame, quoted, env));
        SEXP t = eval(call, ns);
        UNPROTECT(4);
        return t;
    }
    mizu_call1(".raise_failure", r);
    UNPROTECT(1);
    return R_NilValue; /* not reached: .raise_failure() raises */
}

/* list(...) of a closure's frame, as R's `list` builds it: each argument forced or evaluated
 * in order, named where the caller named it. */
static SEXP mizu_dots_list(SEXP frame) {
    SEXP dots = findVarInFrame3(frame, R_DotsSymbol, TRUE);
    if (TYPEOF(dots) != DOTSXP) return allocVector(VECSXP, 0); /* no `...` given */
    R_xlen_t n = 0;
    int named = 0;
    for (SEXP d = dots; d != R_NilValue; d = CDR(d)) {
        n++;
        if (TAG(d) != R_NilValue) named = 1;
    }
    SEXP out = PROTECT(allocVector(VECSXP, n));
    SEXP names = PROTECT(named ? allocVector(STRSXP, n) : R_NilValue);
    R_xlen_t i = 0;
    for (SEXP d = dots; d != R_NilValue; d = CDR(d), i++) {
        if (CAR(d) == R_MissingArg) {
            if (named && TAG(d) != R_NilValue)
                error("the value of `%s` in `...` is missing", CHAR(PRINTNAME(TAG(d))));
            error("value %d in `...` is missing", (int) (i + 1));
        }
        SET_VECTOR_ELT(out, i, eval(CAR(d), frame));
        if (named)
            SET_STRING_ELT(names, i, TAG(d) == R_NilValue ? R_BlankString : PRINTNAME(TAG(d)));
    }
    if (named) setAttrib(out, R_NamesSymbol, names);
    UNPROTECT(2);
    return out;
}

/* mizu_submit(.pool, .expr, ...) passes only its frame: `.pool`, `substitute(.expr)` and
 * `list(...)` are taken from it here, in the order R would evaluate them as arguments. As R
 * calls of their own in the closure, `substitute` and `list` cost ~0.5 us per task, a fifth
 * of a round trip. */
SEXP mizu_submit_frame(SEXP frame) {
    /* (Symbols are never collected; install() hashes the name each time it is called.) */
    static SEXP pool_sym = NULL, expr_sym = NULL;
    if (pool_sym == NULL) {
        pool_sym = install(".pool");
        expr_sym = install(".expr");
    }
    if (TYPEOF(frame) != ENVSXP) error("mizu: internal error: a submit without its frame");
    SEXP pool = PROTECT(eval(pool_sym, frame));
    SEXP expr = PROTECT(substitute(expr_sym, frame));
    SEXP vars = PROTECT(mizu_dots_list(frame));
    SEXP t = mizu_submit_shim(pool, expr, vars, frame);
    UNPROTECT(3);
    return t;
}

/* mizu_collect(): the value, or what .value() makes of an outcome list (a value, the
 * mizu_timeout sentinel, or a raised condition). */
SEXP mizu_collect_shim(SEXP task, SEXP timeout) {
    int outcome = 0;
    SEXP r = mizu_rs_collect_value(task, timeout, &outcome);
    if (!outcome) return r;
    PROTECT(r);
    SEXP v = mizu_call1(".value", r);
    UNPROTECT(1);
    return v;
}

/* The common chunk of a map on a worker (no seed, no type): `f(xs[[i]], ...)` for i in 1..n,
 * the way lapply runs its calls — one call built once, evaluated with the position counted in
 * place — instead of an interpreted loop, which costs ~200 ns more per element. `rho` is the
 * frame of a closure with `...` (the map's extra arguments); `pos`, an integer vector of
 * length one that the caller allocated for this, holds the position of the element running,
 * so that an error handler can name the failing one (a condition long-jumps out of here;
 * there is nothing to release). The results as a list. */
SEXP mizu_each(SEXP f, SEXP xs, SEXP rho, SEXP pos) {
    if (TYPEOF(rho) != ENVSXP || TYPEOF(pos) != INTSXP || XLENGTH(pos) != 1)
        error("mizu: internal error: bad arguments to the chunk loop");
    R_xlen_t n = xlength(xs);
    if (n > INT_MAX) error("mizu: a chunk of more than %d elements", INT_MAX);
    SEXP f_sym = install("f"), xs_sym = install("xs"), i_sym = install("i");
    defineVar(f_sym, f, rho);
    defineVar(xs_sym, xs, rho);
    defineVar(i_sym, pos, rho);
    SEXP arg = PROTECT(lang3(R_Bracket2Symbol, xs_sym, i_sym));
    SEXP call = PROTECT(lang3(f_sym, arg, R_DotsSymbol));
    SEXP out = PROTECT(allocVector(VECSXP, n));
    for (R_xlen_t i = 0; i < n; i++) {
        INTEGER(pos)[0] = (int) (i + 1);
        SEXP r = R_forceAndCall(call, 1, rho);
        /* As lapply does: a value some binding still refers to is not shared mutably. */
        if (MAYBE_REFERENCED(r)) r = lazy_duplicate(r);
        SET_VECTOR_ELT(out, i, r);
    }
    UNPROTECT(3);
    return out;
}

/* A task's globals (the fourth element of its message, see .expr_message()) are bound in the
 * worker's global environment while it runs, where the global functions among them find one
 * another. mizu_bind_globals() binds the named values of `globals` there and returns what
 * they replaced — list(symbols, old values, whether each had one) — for
 * mizu_unbind_globals() to put back when the task ends. As R calls (exists, mget, list2env,
 * rm) the two took ~30 us per task. A locked binding fails the task before anything is bound;
 * a promise that a global replaces is put back unforced. */
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
    SEXP out = PROTECT(allocVector(VECSXP, 3));
    SET_VECTOR_ELT(out, 0, syms);
    SET_VECTOR_ELT(out, 1, old);
    SET_VECTOR_ELT(out, 2, had);
    UNPROTECT(4);
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

/* Which of `names` (a character vector) are bound in the frame of `env`, as a logical vector:
 * `exists(n, envir = env, inherits = FALSE)` for each, in one call. */
SEXP mizu_in_frame(SEXP names, SEXP env) {
    if (TYPEOF(names) != STRSXP || TYPEOF(env) != ENVSXP)
        error("mizu: internal error: bad arguments to in_frame");
    R_xlen_t n = XLENGTH(names);
    SEXP out = PROTECT(allocVector(LGLSXP, n));
    for (R_xlen_t i = 0; i < n; i++)
        LOGICAL(out)[i] = R_existsVarInFrame(env, installTrChar(STRING_ELT(names, i)));
    UNPROTECT(1);
    return out;
}

/* The values of `names` in the frames `envs` (a list of environments, one per name, or one
 * environment for all), as a named list: `get(n, envir = e, inherits = FALSE)` for each,
 * promises forced. */
SEXP mizu_values_in(SEXP names, SEXP envs) {
    R_xlen_t n = TYPEOF(names) == STRSXP ? XLENGTH(names) : -1;
    int one = TYPEOF(envs) == ENVSXP;
    if (n < 0 || !(one || (TYPEOF(envs) == VECSXP && XLENGTH(envs) == n)))
        error("mizu: internal error: bad arguments to values_in");
    SEXP out = PROTECT(allocVector(VECSXP, n));
    for (R_xlen_t i = 0; i < n; i++) {
        SEXP env = one ? envs : VECTOR_ELT(envs, i);
        if (TYPEOF(env) != ENVSXP) error("mizu: internal error: not an environment");
        SEXP sym = installTrChar(STRING_ELT(names, i));
        SEXP v = findVarInFrame3(env, sym, TRUE);
        if (v == R_UnboundValue) error("object '%s' not found", CHAR(PRINTNAME(sym)));
        if (TYPEOF(v) == PROMSXP) {
            PROTECT(v);
            v = eval(v, env);
            UNPROTECT(1);
        }
        SET_VECTOR_ELT(out, i, v);
    }
    setAttrib(out, R_NamesSymbol, names);
    UNPROTECT(1);
    return out;
}

/* The environment `sym` is found in from `env` when that is the global environment or a
 * function's frame; NULL when it is found first in a package's namespace, its imports or base
 * (which package code, or code run in a namespace as tests are, reaches before the global
 * environment), in a package on the search path after it, or nowhere. */
static SEXP global_frame_of(SEXP sym, SEXP env) {
    int in_package = 0;
    for (;;) {
        if (env == R_EmptyEnv || env == R_BaseEnv || TYPEOF(env) != ENVSXP) return NULL;
        if (env == R_BaseNamespace || R_IsNamespaceEnv(env)) in_package = 1;
        if (R_existsVarInFrame(env, sym)) return env == R_GlobalEnv || !in_package ? env : NULL;
        if (env == R_GlobalEnv) return NULL;
        env = ENCLOS(env);
    }
}

/* For each of `names` (a character vector) not in `bound`: the environment it is found in
 * from `env` when that is the global environment or a function's frame — a global of an
 * expression written in `env` — as `list(names = , envs = )`; NULL when there is none. One C
 * loop: it runs for every submit of an expression that uses a variable it does not bind. */
SEXP mizu_global_frames(SEXP names, SEXP bound, SEXP env) {
    if (TYPEOF(names) != STRSXP || TYPEOF(env) != ENVSXP) return R_NilValue;
    R_xlen_t n = XLENGTH(names), nb = TYPEOF(bound) == STRSXP ? XLENGTH(bound) : 0;
    SEXP found = PROTECT(allocVector(STRSXP, n));
    SEXP envs = PROTECT(allocVector(VECSXP, n));
    R_xlen_t k = 0;
    for (R_xlen_t i = 0; i < n; i++) {
        SEXP s = STRING_ELT(names, i);
        int is_bound = 0;
        for (R_xlen_t j = 0; j < nb && !is_bound; j++) {
            SEXP b = STRING_ELT(bound, j);
            is_bound = b == s || strcmp(CHAR(b), CHAR(s)) == 0;
        }
        if (is_bound) continue;
        SEXP frame = global_frame_of(installTrChar(s), env);
        if (frame == NULL) continue;
        SET_STRING_ELT(found, k, s);
        SET_VECTOR_ELT(envs, k, frame);
        k++;
    }
    if (k == 0) {
        UNPROTECT(2);
        return R_NilValue;
    }
    found = PROTECT(lengthgets(found, k));
    envs = PROTECT(lengthgets(envs, k));
    SEXP out = PROTECT(allocVector(VECSXP, 2));
    SET_VECTOR_ELT(out, 0, found);
    SET_VECTOR_ELT(out, 1, envs);
    SEXP nms = PROTECT(allocVector(STRSXP, 2));
    SET_STRING_ELT(nms, 0, mkChar("names"));
    SET_STRING_ELT(nms, 1, mkChar("envs"));
    setAttrib(out, R_NamesSymbol, nms);
    UNPROTECT(6);
    return out;
}

/* The position (from 1) of the first of `entries` — a list of list(key, value) — whose key is
 * identical() to `key`, or 0: the lookup of the package's small caches (the free names of an
 * expression or a function's code), one C loop instead of an R loop of identical() calls. */
SEXP mizu_find_identical(SEXP entries, SEXP key) {
    if (TYPEOF(entries) != VECSXP) error("mizu: internal error: a cache is not a list");
    R_xlen_t n = XLENGTH(entries);
    for (R_xlen_t i = 0; i < n; i++) {
        SEXP e = VECTOR_ELT(entries, i);
        if (TYPEOF(e) == VECSXP && XLENGTH(e) == 2 &&
            R_compute_identical(VECTOR_ELT(e, 0), key, IDENT_USE_CLOENV))
            return ScalarInteger(i < INT_MAX ? (int) (i + 1) : 0);
    }
    return ScalarInteger(0);
}
