//! Tensor shapes: a small inline array, so shapes are `Copy` and cheap.

use std::fmt;

pub const MAX_DIMS: usize = 6;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    dims: [u64; MAX_DIMS],
    len: u8,
}

impl Shape {
    /// A shape from its dims. More than [`MAX_DIMS`] dims are folded into the last
    /// one (only byte counts matter to the engine).
    pub fn new(dims: &[u64]) -> Shape {
        let mut s = Shape::default();
        for (i, d) in dims.iter().enumerate() {
            if i < MAX_DIMS {
                s.dims[i] = *d;
                s.len = (i + 1) as u8;
            } else {
                s.dims[MAX_DIMS - 1] *= *d;
            }
        }
        s
    }

    pub const fn scalar() -> Shape {
        Shape {
            dims: [0; MAX_DIMS],
            len: 0,
        }
    }

    pub fn dims(&self) -> &[u64] {
        &self.dims[..self.len as usize]
    }

    pub fn rank(&self) -> usize {
        self.len as usize
    }

    /// Product of the dims; a 0-dim tensor has one element (engine.md §1.2).
    /// Elements; saturates, so an absurd shape asks the allocator for too
    /// much (a clear error) instead of wrapping to a small size.
    pub fn numel(&self) -> u64 {
        self.dims().iter().fold(1, |n: u64, &d| n.saturating_mul(d))
    }

    pub fn dim(&self, i: usize) -> u64 {
        self.dims()[i]
    }

    pub fn last(&self) -> u64 {
        self.dims().last().copied().unwrap_or(1)
    }

    /// Same shape with the last dim replaced.
    pub fn with_last(&self, last: u64) -> Shape {
        let mut s = *self;
        if s.len == 0 {
            return Shape::new(&[last]);
        }
        s.dims[s.len as usize - 1] = last;
        s
    }

    /// Swap two dims (a transpose's geometry).
    pub fn swapped(&self, a: usize, b: usize) -> Shape {
        let mut s = *self;
        s.dims.swap(a, b);
        s
    }

    /// Product of all dims but the last (layer norm's M, linear's rows).
    pub fn leading(&self) -> u64 {
        let d = self.dims();
        if d.is_empty() {
            1
        } else {
            d[..d.len() - 1].iter().product()
        }
    }

    pub fn to_vec(&self) -> Vec<u64> {
        self.dims().to_vec()
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

impl fmt::Display for Shape {
    /// `[16, 128]`, as PyTorch prints sizes in error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.dims().iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

#[cfg(test)]
mod tests {
    use super::Shape;

    #[test]
    fn numel_of_scalar_is_one() {
        assert_eq!(Shape::scalar().numel(), 1);
        assert_eq!(Shape::new(&[2, 3, 4]).numel(), 24);
        assert_eq!(Shape::new(&[2, 0]).numel(), 0);
        assert_eq!(
            Shape::new(&[1 << 40, 1 << 40]).numel(),
            u64::MAX,
            "saturates"
        );
        assert_eq!(format!("{}", Shape::new(&[16, 128])), "[16, 128]");
    }
}
