//! A check of R's binary serialization (native byte order, version 2 or 3) before R reads it.
//!
//! R's unserializer trusts its input: a negative string length becomes a negative-size stack
//! array (a byte flipped in a payload crashed the process), attributes that are not a
//! pairlist are walked as one later, an ALTREP class's state is used as the class expects.
//! This walks the stream as R will and refuses what R would read unsafely: lengths that are
//! negative or longer than what is left, strings and attributes where R requires them (a
//! string element must be a string, attributes a pairlist), references to items not read
//! yet, ALTREP and persistence items (mizu writes neither: it serializes with version 2,
//! which writes ALTREP objects as plain vectors), nesting past [`MAX_DEPTH`]. It does not
//! make R's reader safe for any input — the values it builds are R's to judge — but every
//! crash a byte-flip search found is refused here.

/// Deepest nesting accepted (R recurses as deep when it reads).
pub const MAX_DEPTH: usize = 2000;

/// What an item must be where it is read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Any,
    /// A CHARSXP (string elements, symbol names).
    Char,
    /// NULL or a pairlist (attributes, environment frames).
    Pairlist,
}

struct Walk<'a> {
    b: &'a [u8],
    at: usize,
    refs: usize,
}

type R<T> = std::result::Result<T, String>;

// Serialization type codes (R's `serialize.c`).
const NILVALUE: u32 = 254;
const GLOBALENV: u32 = 253;
const UNBOUNDVALUE: u32 = 252;
const MISSINGARG: u32 = 251;
const BASENAMESPACE: u32 = 250;
const NAMESPACE: u32 = 249;
const PACKAGE: u32 = 248;
const PERSIST: u32 = 247;
const BCREPDEF: u32 = 244;
const BCREPREF: u32 = 243;
const EMPTYENV: u32 = 242;
const BASEENV: u32 = 241;
const ATTRLANG: u32 = 240;
const ATTRLIST: u32 = 239;
const REF: u32 = 255;

impl Walk<'_> {
    fn int(&mut self) -> R<i32> {
        let w = self
            .b
            .get(self.at..self.at + 4)
            .ok_or("truncated serialization")?;
        self.at += 4;
        Ok(i32::from_le_bytes(w.try_into().expect("4 bytes")))
    }

    fn skip(&mut self, n: usize) -> R<()> {
        if n > self.b.len() - self.at {
            return Err(format!(
                "{n} bytes claimed, {} left",
                self.b.len() - self.at
            ));
        }
        self.at += n;
        Ok(())
    }

    /// A vector length (R's `ReadLENGTH`), which must leave room for `each` bytes per element.
    fn len(&mut self, each: usize) -> R<usize> {
        let n = self.int()?;
        let n = match n {
            -1 => {
                let hi = self.int()? as u32 as u64;
                let lo = self.int()? as u32 as u64;
                (hi << 32) + lo
            }
            n if n < 0 => return Err(format!("negative length {n}")),
            n => n as u64,
        };
        let left = (self.b.len() - self.at) as u64;
        if n.saturating_mul(each.max(1) as u64) > left {
            return Err(format!("length {n} with {left} bytes left"));
        }
        Ok(n as usize)
    }

    fn item(&mut self, want: Want, depth: usize) -> R<()> {
        if depth > MAX_DEPTH {
            return Err("nested too deep".into());
        }
        let flags = self.int()? as u32;
        let t = flags & 0xFF;
        let has_attr = flags & (1 << 9) != 0;
        let has_tag = flags & (1 << 10) != 0;
        match want {
            Want::Char if t != 9 => return Err(format!("type {t} where a string must be")),
            Want::Pairlist if t != NILVALUE && t != 2 => {
                return Err(format!("type {t} where a pairlist must be"));
            }
            _ => {}
        }
        let d = depth + 1;
        match t {
            NILVALUE | EMPTYENV | BASEENV | GLOBALENV | UNBOUNDVALUE | MISSINGARG
            | BASENAMESPACE => return Ok(()),
            REF => {
                let i = match flags >> 8 {
                    0 => self.int()?,
                    i => i as i32,
                };
                if i < 1 || i as usize > self.refs {
                    return Err(format!("reference {i} of {}", self.refs));
                }
                return Ok(());
            }
            1 => {
                self.item(Want::Char, d)?;
                self.refs += 1;
                return Ok(());
            }
            PACKAGE | NAMESPACE => {
                if self.int()? != 0 {
                    return Err("bad string vector".into());
                }
                let n = self.len(4)?;
                for _ in 0..n {
                    self.item(Want::Char, d)?;
                }
                self.refs += 1;
                return Ok(());
            }
            4 => {
                self.int()?;
                self.refs += 1;
                self.item(Want::Any, d)?;
                self.item(Want::Pairlist, d)?;
                self.item(Want::Any, d)?;
                self.item(Want::Pairlist, d)?;
                return Ok(());
            }
            // Pairlists, calls, closures, promises, `...`: attributes, tag, head, then the
            // rest (read as the next item, as R does).
            2 | 3 | 5 | 6 | 17 => {
                if has_attr {
                    self.item(Want::Pairlist, d)?;
                }
                if has_tag {
                    self.item(Want::Any, d)?;
                }
                self.item(Want::Any, d)?;
                return self.item(Want::Any, d);
            }
            22 => {
                self.refs += 1;
                self.item(Want::Any, d)?;
                self.item(Want::Any, d)?;
            }
            23 => self.refs += 1,
            7 | 8 => {
                let n = self.int()?;
                if !(0..1000).contains(&n) {
                    return Err(format!("primitive name of {n} bytes"));
                }
                self.skip(n as usize)?;
            }
            9 => {
                let n = self.int()?;
                if n != -1 {
                    let n = usize::try_from(n).map_err(|_| format!("string of {n} bytes"))?;
                    self.skip(n)?;
                }
                if has_attr {
                    self.item(Want::Any, d)?;
                }
                return Ok(());
            }
            10 | 13 => {
                let n = self.len(4)?;
                self.skip(n * 4)?;
            }
            14 => {
                let n = self.len(8)?;
                self.skip(n * 8)?;
            }
            15 => {
                let n = self.len(16)?;
                self.skip(n * 16)?;
            }
            24 => {
                let n = self.len(1)?;
                self.skip(n)?;
            }
            16 => {
                for _ in 0..self.len(4)? {
                    self.item(Want::Char, d)?;
                }
            }
            19 | 20 => {
                for _ in 0..self.len(4)? {
                    self.item(Want::Any, d)?;
                }
            }
            21 => {
                let reps = self.int()?;
                let reps = usize::try_from(reps).map_err(|_| "bad bytecode".to_string())?;
                self.bytecode(reps, d)?;
            }
            25 => {}
            PERSIST => return Err("a persistent reference (mizu never writes one)".into()),
            t => return Err(format!("item type {t}")),
        }
        if has_attr {
            self.item(Want::Pairlist, d)?;
        }
        Ok(())
    }

    fn bytecode(&mut self, reps: usize, depth: usize) -> R<()> {
        if depth > MAX_DEPTH {
            return Err("nested too deep".into());
        }
        self.item(Want::Any, depth + 1)?;
        let n = self.len(4)?;
        for _ in 0..n {
            let t = self.int()? as u32;
            match t {
                21 => self.bytecode(reps, depth + 1)?,
                2 | 6 | BCREPDEF | BCREPREF | ATTRLANG | ATTRLIST => {
                    self.bc_lang(t, reps, depth + 1)?
                }
                _ => self.item(Want::Any, depth + 1)?,
            }
        }
        Ok(())
    }

    fn bc_lang(&mut self, t: u32, reps: usize, depth: usize) -> R<()> {
        if depth > MAX_DEPTH {
            return Err("nested too deep".into());
        }
        let mut t = t;
        match t {
            BCREPREF => {
                let i = self.int()?;
                if i < 0 || i as usize >= reps {
                    return Err(format!("bytecode reference {i} of {reps}"));
                }
                return Ok(());
            }
            BCREPDEF | 2 | 6 | ATTRLANG | ATTRLIST => {}
            _ => return self.item(Want::Any, depth + 1),
        }
        if t == BCREPDEF {
            let pos = self.int()?;
            if pos < 0 || pos as usize >= reps {
                return Err(format!("bytecode definition {pos} of {reps}"));
            }
            t = self.int()? as u32;
            if !matches!(t, 2 | 6 | ATTRLANG | ATTRLIST) {
                return Err(format!("bytecode definition of type {t}"));
            }
        }
        if matches!(t, ATTRLANG | ATTRLIST) {
            self.item(Want::Pairlist, depth + 1)?;
        }
        self.item(Want::Any, depth + 1)?;
        let car = self.int()? as u32;
        self.bc_lang(car, reps, depth + 1)?;
        let cdr = self.int()? as u32;
        self.bc_lang(cdr, reps, depth + 1)
    }
}

/// Checks a serialization (see the module docs); the error says what is wrong, and where.
pub fn check(b: &[u8]) -> crate::Result<()> {
    let mut w = Walk { b, at: 0, refs: 0 };
    walk(&mut w).map_err(|why| crate::error::malformed(w.at, why))
}

fn walk(w: &mut Walk<'_>) -> R<()> {
    let b = w.b;
    if b.get(..2) != Some(b"B\n") {
        return Err("not R's native binary format".into());
    }
    w.at = 2;
    let version = w.int()?;
    w.int()?;
    w.int()?;
    match version {
        2 => {}
        3 => {
            let n = w.int()?;
            if !(0..64).contains(&n) {
                return Err(format!("encoding name of {n} bytes"));
            }
            w.skip(n as usize)?;
        }
        v => return Err(format!("serialization version {v}")),
    }
    w.item(Want::Any, 0)?;
    if w.at != b.len() {
        return Err(format!("{} bytes after the value", b.len() - w.at));
    }
    Ok(())
}
