//! The generated files: bytes computed from their offset ([`Pattern`]), and
//! checked as they come back ([`Verifier`]).

/// The content of one generated file: byte `i` is byte `i mod 8` (little
/// endian) of a SplitMix64 finalizer of `seed` and `i / 8`, so any range
/// can be produced (and checked) without the bytes before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pattern(u64);

impl Pattern {
    /// The file of `seed`.
    pub fn new(seed: u64) -> Pattern {
        Pattern(seed)
    }

    fn word(self, k: u64) -> [u8; 8] {
        let mut z = self.0 ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)).to_le_bytes()
    }

    /// Writes the bytes at `offset..offset + buf.len()` into `buf`.
    pub fn fill(self, offset: u64, buf: &mut [u8]) {
        let mut pos = offset;
        let mut i = 0;
        while i < buf.len() && !pos.is_multiple_of(8) {
            buf[i] = self.word(pos / 8)[(pos % 8) as usize];
            i += 1;
            pos += 1;
        }
        let mut words = buf[i..].chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.word(pos / 8));
            pos += 8;
        }
        let rest = words.into_remainder();
        if !rest.is_empty() {
            let w = self.word(pos / 8);
            rest.copy_from_slice(&w[..rest.len()]);
        }
    }
}

/// Checks a received stream against its [`Pattern`], piece by piece.
#[derive(Debug)]
pub struct Verifier {
    pattern: Pattern,
    /// Bytes seen so far.
    pub offset: u64,
    /// Offset of the first byte that differs.
    pub mismatch: Option<u64>,
    scratch: Vec<u8>,
}

impl Verifier {
    /// For the stream of `pattern`, from offset 0.
    pub fn new(pattern: Pattern) -> Verifier {
        Verifier {
            pattern,
            offset: 0,
            mismatch: None,
            scratch: Vec::new(),
        }
    }

    /// The next received bytes.
    pub fn feed(&mut self, data: &[u8]) {
        if self.mismatch.is_none() && !data.is_empty() {
            self.scratch.resize(data.len(), 0);
            let want = &mut self.scratch[..data.len()];
            self.pattern.fill(self.offset, want);
            if want != data {
                let at = want.iter().zip(data).position(|(a, b)| a != b);
                self.mismatch = Some(self.offset + at.unwrap_or(0) as u64);
            }
        }
        self.offset += data.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_random_access_and_differ_per_seed() {
        let p = Pattern::new(42);
        let mut whole = vec![0u8; 1000];
        p.fill(0, &mut whole);
        // Any split gives the same bytes.
        for cut in [1usize, 3, 7, 8, 9, 17, 500, 999] {
            let (mut a, mut b) = (vec![0u8; cut], vec![0u8; 1000 - cut]);
            p.fill(0, &mut a);
            p.fill(cut as u64, &mut b);
            assert_eq!([a, b].concat(), whole, "cut at {cut}");
        }
        let mut mid = vec![0u8; 5];
        p.fill(13, &mut mid);
        assert_eq!(mid, whole[13..18]);
        let mut other = vec![0u8; 1000];
        Pattern::new(43).fill(0, &mut other);
        assert_ne!(other, whole);
        // Not a constant or short-period stream.
        assert!(whole.iter().collect::<std::collections::HashSet<_>>().len() > 200);
        assert_ne!(whole[..8], whole[8..16]);
    }

    #[test]
    fn verifier_finds_the_first_wrong_byte() {
        let p = Pattern::new(7);
        let mut data = vec![0u8; 10_000];
        p.fill(0, &mut data);
        let mut v = Verifier::new(p);
        for piece in data.chunks(333) {
            v.feed(piece);
        }
        assert_eq!((v.offset, v.mismatch), (10_000, None));
        data[4321] ^= 1;
        let mut v = Verifier::new(p);
        for piece in data.chunks(1000) {
            v.feed(piece);
        }
        assert_eq!(v.mismatch, Some(4321));
        // Another file's bytes do not verify.
        let mut v = Verifier::new(Pattern::new(8));
        v.feed(&data[..64]);
        assert!(v.mismatch.is_some());
    }
}
