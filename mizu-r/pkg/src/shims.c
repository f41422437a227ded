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
SEXP mizu_rs_submit(SEXP pool, SEXP msg);
SEXP mizu_expr_message_in(SEXP expr, SEXP vars, SEXP env, SEXP ns); /* globals.c */

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
 * use the caller's variables answers "mizu_globals": it goes with them (globals.c), found
 * from where the expression was written, still without an R closure. */
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
        /* The expression may use variables of the caller's, found from where it was written:
         * the environment of mizu_submit's `.expr` promise (unforced: only substituted). */
        SEXP env = R_NilValue;
        if (TYPEOF(frame) == ENVSXP) {
            SEXP p = findVarInFrame3(frame, install(".expr"), TRUE);
            if (TYPEOF(p) == PROMSXP && TYPEOF(PRENV(p)) == ENVSXP) env = PRENV(p);
        }
        /* (`frame` is a frame of the package's functions: its enclosure is the namespace.) */
        SEXP ns = PROTECT(TYPEOF(frame) == ENVSXP && R_IsNamespaceEnv(ENCLOS(frame))
                              ? ENCLOS(frame)
                              : mizu_namespace());
        SEXP t;
        if (env != R_NilValue) {
            SEXP msg = PROTECT(mizu_expr_message_in(expr, vars, env, ns));
            t = mizu_rs_submit(pool, msg);
            if (TYPEOF(t) == STRSXP) {
                PROTECT(t);
                mizu_call1(".raise_failure", t);
            }
        } else {
            /* Another caller's frame: .submit_globals() asks parent.frame() for it. */
            SEXP quoted = PROTECT(lang2(install("quote"), expr));
            SEXP call = PROTECT(lang5(install(".submit_globals"), pool, vars, frame, quoted));
            t = eval(call, ns);
            UNPROTECT(1);
        }
        UNPROTECT(3);
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
 * of a round trip. The routine is reached through `.External2`, which hands it the frame it
 * is called from (`frame`): `environment()`, a closure call of base R's, cost ~0.25 us more.
 * `call`, `op` and `args` (the routine itself) are not used. */
SEXP mizu_submit_frame(SEXP call, SEXP op, SEXP args, SEXP frame) {
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

/* The common chunk of a map on a worker (no seed, no type): `f(xs[[i]], <dots>)` for i in
 * 1..n, the way lapply runs its calls — one call built once, evaluated with the position
 * counted in place — instead of an interpreted loop, which costs ~200 ns more per element.
 * The call is evaluated in a frame of its own, where `dots` (the map's extra arguments, a
 * list) are bound to names of their own and passed by those names: a value that is a symbol
 * or a call reaches `f` as it is, not evaluated (as lapply's `...` passes it), and building
 * the frame costs nothing per argument that R would interpret (a `do.call` with quoted
 * arguments cost ~5 us a chunk). `pos`, an integer vector of length one that the caller
 * allocated for this, holds the position of the element running, so that an error handler
 * can name the failing one (a condition long-jumps out of here; there is nothing to release).
 * The results as a list. */
static SEXP mizu_each(SEXP f, SEXP xs, SEXP dots, SEXP pos) {
    if (TYPEOF(dots) != VECSXP || TYPEOF(pos) != INTSXP || XLENGTH(pos) != 1)
        error("mizu: internal error: bad arguments to the chunk loop");
    R_xlen_t n = xlength(xs);
    if (n > INT_MAX) error("mizu: a chunk of more than %d elements", INT_MAX);
    R_xlen_t nd = XLENGTH(dots);
    SEXP rho = PROTECT(R_NewEnv(R_BaseEnv, FALSE, 0));
    SEXP f_sym = install("f"), xs_sym = install("xs"), i_sym = install("i");
    defineVar(f_sym, f, rho);
    defineVar(xs_sym, xs, rho);
    defineVar(i_sym, pos, rho);
    SEXP tags = getAttrib(dots, R_NamesSymbol);
    /* f(xs[[i]], <tag1> = .mizu_arg1, ...), built from the end. */
    SEXP args = R_NilValue;
    PROTECT_INDEX ipx;
    PROTECT_WITH_INDEX(args, &ipx);
    for (R_xlen_t k = nd; k > 0; k--) {
        char name[32];
        snprintf(name, sizeof name, ".mizu_arg%ld", (long) k);
        SEXP sym = install(name);
        defineVar(sym, VECTOR_ELT(dots, k - 1), rho);
        args = CONS(sym, args);
        REPROTECT(args, ipx);
        if (TYPEOF(tags) == STRSXP && STRING_ELT(tags, k - 1) != NA_STRING) {
            const char *tag = CHAR(STRING_ELT(tags, k - 1));
            if (tag[0] != '\0') SET_TAG(args, install(tag));
        }
    }
    SEXP arg = PROTECT(lang3(R_Bracket2Symbol, xs_sym, i_sym));
    SEXP call = PROTECT(LCONS(f_sym, CONS(arg, args)));
    SEXP out = PROTECT(allocVector(VECSXP, n));
    for (R_xlen_t i = 0; i < n; i++) {
        INTEGER(pos)[0] = (int) (i + 1);
        SEXP r = R_forceAndCall(call, 1, rho);
        /* As lapply does: a value some binding still refers to is not shared mutably. */
        if (MAYBE_REFERENCED(r)) r = lazy_duplicate(r);
        SET_VECTOR_ELT(out, i, r);
    }
    UNPROTECT(5);
    return out;
}

/* The common chunk of a map on a worker: `mizu_each` with an error handler (a calling one, as
 * `withCallingHandlers` establishes, run before the worker's own) that records the failing
 * element's position, `start + i - 1`, as `element` in the worker's state `st`; cleared after
 * the loop, since the handler also sees errors `f` catches itself. */
struct each_args { SEXP f, xs, dots, pos; };
struct failing { SEXP start, pos, st; };

static SEXP each_body(void *data) {
    struct each_args *a = data;
    return mizu_each(a->f, a->xs, a->dots, a->pos);
}

static SEXP note_element(SEXP cond, void *data) {
    (void) cond;
    struct failing *m = data;
    int i = INTEGER(m->pos)[0];
    SEXP at = TYPEOF(m->start) == INTSXP && INTEGER(m->start)[0] != NA_INTEGER
        ? ScalarInteger(INTEGER(m->start)[0] + i - 1)
        : ScalarReal(asReal(m->start) + i - 1);
    PROTECT(at);
    defineVar(install("element"), at, m->st);
    UNPROTECT(1);
    return R_NilValue;
}

SEXP mizu_chunk_each(SEXP f, SEXP xs, SEXP dots, SEXP start, SEXP st) {
    if (TYPEOF(st) != ENVSXP || XLENGTH(start) != 1 ||
        (TYPEOF(start) != INTSXP && TYPEOF(start) != REALSXP))
        error("mizu: internal error: bad arguments to the chunk loop");
    SEXP pos = PROTECT(allocVector(INTSXP, 1));
    INTEGER(pos)[0] = 0;
    struct each_args a = {f, xs, dots, pos};
    struct failing m = {start, pos, st};
    SEXP out = PROTECT(R_withCallingErrorHandler(each_body, &a, note_element, &m));
    defineVar(install("element"), R_NilValue, st);
    UNPROTECT(2);
    return out;
}

/* The messages of a map's chunks, as mizu_map() sends them: chunk k is
 * list("m", fun, dots, xs[s:(s + len - 1)], seed, s, ptype, spec, globals[, packages]) for
 * s = starts[k] and len = lens[k] (`common` holds fun, dots, seed, ptype, spec, globals and
 * packages, NULL when there are none). A slice is what `xs[ix]` gives an unnamed list or
 * plain atomic vector: the elements, no attributes. NULL for any other `xs` (the R code then
 * slices it itself). Built here rather than by a closure per chunk and `.mapply(`:`)`, ~3 us a
 * chunk in R. */
SEXP mizu_chunk_msgs(SEXP starts, SEXP lens, SEXP xs, SEXP common) {
    if (TYPEOF(starts) != INTSXP || TYPEOF(lens) != INTSXP || XLENGTH(starts) != XLENGTH(lens)
        || TYPEOF(common) != VECSXP || XLENGTH(common) != 7)
        error("mizu: internal error: bad arguments to the chunk messages");
    int t = TYPEOF(xs);
    if (t != VECSXP && t != LGLSXP && t != INTSXP && t != REALSXP && t != CPLXSXP
        && t != RAWSXP && t != STRSXP)
        return R_NilValue;
    R_xlen_t n = XLENGTH(starts), total = XLENGTH(xs);
    SEXP packages = VECTOR_ELT(common, 6);
    int width = isNull(packages) ? 9 : 10;
    SEXP kind = PROTECT(mkString("m"));
    SEXP out = PROTECT(allocVector(VECSXP, n));
    for (R_xlen_t k = 0; k < n; k++) {
        int s = INTEGER(starts)[k], len = INTEGER(lens)[k];
        if (s == NA_INTEGER || len == NA_INTEGER || s < 1 || len < 0
            || (R_xlen_t) s - 1 + len > total)
            error("mizu: internal error: a chunk outside the map");
        R_xlen_t from = (R_xlen_t) s - 1;
        SEXP part = PROTECT(allocVector(t, len));
        switch (t) {
        case VECSXP:
            for (int j = 0; j < len; j++) SET_VECTOR_ELT(part, j, VECTOR_ELT(xs, from + j));
            break;
        case STRSXP:
            for (int j = 0; j < len; j++) SET_STRING_ELT(part, j, STRING_ELT(xs, from + j));
            break;
        /* (Through the region getters: a compact sequence such as 1:n is not expanded.) */
        case LGLSXP: LOGICAL_GET_REGION(xs, from, len, LOGICAL(part)); break;
        case INTSXP: INTEGER_GET_REGION(xs, from, len, INTEGER(part)); break;
        case REALSXP: REAL_GET_REGION(xs, from, len, REAL(part)); break;
        case CPLXSXP: COMPLEX_GET_REGION(xs, from, len, COMPLEX(part)); break;
        case RAWSXP: RAW_GET_REGION(xs, from, len, RAW(part)); break;
        }
        SEXP m = allocVector(VECSXP, width);
        SET_VECTOR_ELT(out, k, m);
        SET_VECTOR_ELT(m, 0, kind);
        SET_VECTOR_ELT(m, 1, VECTOR_ELT(common, 0));
        SET_VECTOR_ELT(m, 2, VECTOR_ELT(common, 1));
        SET_VECTOR_ELT(m, 3, part);
        SET_VECTOR_ELT(m, 4, VECTOR_ELT(common, 2));
        SET_VECTOR_ELT(m, 5, ScalarInteger(s));
        SET_VECTOR_ELT(m, 6, VECTOR_ELT(common, 3));
        SET_VECTOR_ELT(m, 7, VECTOR_ELT(common, 4));
        SET_VECTOR_ELT(m, 8, VECTOR_ELT(common, 5));
        if (width == 10) SET_VECTOR_ELT(m, 9, packages);
        UNPROTECT(1);
    }
    UNPROTECT(2);
    return out;
}
