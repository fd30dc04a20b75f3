//! A binary search whose steps are arithmetic, not branches.
//!
//! `slice::partition_point` with a `u128` key compiles to a conditional jump
//! per step; on a random request stream half of those jumps are mispredicted.
//! Here each step picks the next base with a conditional move, so the only
//! branch is the loop itself, whose trip count depends on the length alone.

/// The index of the first element for which `before` is false, in a slice
/// where every such element follows every element for which it is true.
#[inline(always)]
pub(super) fn lower_bound<T>(s: &[T], before: impl Fn(&T) -> bool) -> usize {
    let mut len = s.len();
    if len == 0 {
        return 0;
    }
    let mut base = 0usize;
    while len > 1 {
        let half = len / 2;
        // SAFETY: `base + len <= s.len()` holds throughout and `half < len`.
        let mid = unsafe { s.get_unchecked(base + half) };
        base = select(before(mid), base + half, base);
        len -= half;
    }
    base + usize::from(before(&s[base]))
}

/// `if cond { a } else { b }` as a conditional move. LLVM's x86 pass that
/// turns conditional moves in loops back into branches would otherwise undo
/// the point of the search above.
#[inline(always)]
fn select(cond: bool, a: usize, b: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        let mut r = b;
        // SAFETY: register-only instructions; no memory, no stack.
        unsafe {
            std::arch::asm!(
                "test {c}, {c}",
                "cmovnz {r}, {a}",
                c = in(reg_byte) u8::from(cond),
                a = in(reg) a,
                r = inout(reg) r,
                options(pure, nomem, nostack),
            );
        }
        r
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        if cond {
            a
        } else {
            b
        }
    }
}

#[cfg(test)]
mod tests {
    use super::lower_bound;

    #[test]
    fn agrees_with_partition_point_at_every_length_and_cut() {
        for n in 0..70usize {
            let v: Vec<u128> = (0..n as u128).map(|i| i * 2).collect();
            for k in 0..(2 * n as u128 + 2) {
                assert_eq!(
                    lower_bound(&v, |x| *x < k),
                    v.partition_point(|x| *x < k),
                    "n {n} k {k}"
                );
            }
        }
    }
}
