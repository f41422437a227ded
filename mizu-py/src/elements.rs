//! `Elements`: the iterator a streamed map returns, over the elements of its chunks' result
//! lists. The chunks come from a Python generator (which waits for each chunk, raises its
//! failures and cancels the rest when it is dropped); the elements are handed out here. A
//! generator that yielded them one by one cost the caller ~60 ns an element, a map's whole
//! collection on 5 µs tasks; the interpreter calls this iterator's `__next__` directly.
//!
//! Like `concurrent.futures`' own map, it holds no reference to an element it has handed
//! out: each one's place in its chunk is cleared as it goes.

use pyo3::prelude::*;
use pyo3::type_object::PyTypeInfo;
use pyo3::types::{PyIterator, PyList};
use pyo3::{PyTraverseError, PyVisit};

/// An iterator over the elements of the lists `chunks` yields, in order.
#[pyclass(module = "pymizu._native")]
pub struct Elements {
    /// What yields the chunks; None once it is exhausted, failed or closed.
    chunks: Option<Py<PyIterator>>,
    /// The chunk being handed out, and the place of its next element.
    chunk: Option<Py<PyList>>,
    next: usize,
}

#[pymethods]
impl Elements {
    #[new]
    fn new(chunks: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Elements {
            chunks: Some(chunks.try_iter()?.unbind()),
            chunk: None,
            next: 0,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        loop {
            if let Some(chunk) = &self.chunk {
                let chunk = chunk.bind(py);
                if self.next < chunk.len() {
                    let x = chunk.get_item(self.next)?;
                    chunk.set_item(self.next, py.None())?;
                    self.next += 1;
                    return Ok(Some(x.unbind()));
                }
                self.chunk = None;
            }
            let Some(chunks) = &self.chunks else {
                return Ok(None);
            };
            let mut chunks = chunks.bind(py).clone();
            match chunks.next() {
                Some(Ok(part)) => {
                    // (A chunk's results are a list; anything else iterable is taken as one.)
                    let part = match part.cast::<PyList>() {
                        Ok(list) => list.clone(),
                        Err(_) => PyList::type_object(py).call1((part,))?.cast_into()?,
                    };
                    self.chunk = Some(part.unbind());
                    self.next = 0;
                }
                Some(Err(e)) => {
                    // As a generator that raised: finished.
                    self.chunks = None;
                    return Err(e);
                }
                None => {
                    self.chunks = None;
                    return Ok(None);
                }
            }
        }
    }

    /// As a generator's `close()`: what is left is dropped, and the chunks' generator closed
    /// (it cancels the chunks not collected yet).
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        self.chunk = None;
        if let Some(chunks) = self.chunks.take() {
            let chunks = chunks.into_bound(py);
            if chunks.hasattr("close")? {
                chunks.call_method0("close")?;
            }
        }
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(c) = &self.chunks {
            visit.call(c)?;
        }
        if let Some(c) = &self.chunk {
            visit.call(c)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.chunks = None;
        self.chunk = None;
    }
}
