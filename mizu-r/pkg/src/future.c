/* The future backend's worker side: a future's expression put into the wrapper `future`
 * builds around it (future::getExpression(), made with a placeholder symbol where the
 * expression goes; the worker keeps it unserialized once per wrapper). substitute() copied the
 * whole wrapper for every future (~126 us: every call of it, and a lookup of every symbol);
 * here only the calls on the way to the placeholder are new, and the rest is shared with the
 * kept wrapper, which stays as it is (R copies a language object that is referred to twice
 * before any change to it). As substitute() does, only calls are walked: a placeholder inside
 * a constant (a function's formals, a vector) is left as it is. */
#include <R.h>
#include <Rinternals.h>

static SEXP filled(SEXP x, SEXP hole, SEXP expr);

/* The cells of a call from `cell` on (`head`: `cell` is the call's own first cell), with the
 * placeholder filled: `cell` itself when nothing in them changed. */
static SEXP filled_cells(SEXP cell, SEXP hole, SEXP expr, int head) {
    if (cell == R_NilValue) return cell;
    SEXP car = PROTECT(filled(CAR(cell), hole, expr));
    SEXP cdr = PROTECT(filled_cells(CDR(cell), hole, expr, 0));
    SEXP out = cell;
    if (car != CAR(cell) || cdr != CDR(cell)) {
        out = head ? LCONS(car, cdr) : CONS(car, cdr);
        SET_TAG(out, TAG(cell));
    }
    UNPROTECT(2);
    return out;
}

static SEXP filled(SEXP x, SEXP hole, SEXP expr) {
    if (x == hole) return expr;
    return TYPEOF(x) == LANGSXP ? filled_cells(x, hole, expr, 1) : x;
}

/* The wrapper `wrapper` with each occurrence of the symbol `hole` in its calls replaced by
 * `expr` (as substitute(wrapper, list(<hole> = expr)) gives it). */
SEXP mizu_fill_hole(SEXP wrapper, SEXP hole, SEXP expr) {
    if (TYPEOF(hole) != SYMSXP) error("mizu: internal error: the placeholder is not a symbol");
    return filled(wrapper, hole, expr);
}
