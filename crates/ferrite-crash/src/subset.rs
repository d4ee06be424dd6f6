//! Which in-flight words reach media in a crash image, and how such a choice is
//! written in a reproducer.
//!
//! Invariants:
//! - A [`Subset`] is applied to the in-flight list of one fence point; it names words
//!   by byte offset (never by position in the list), so a reproducer stays valid when
//!   an unrelated word happens to equal its durable value in a later run.
//! - [`plan`] is deterministic in its inputs and its random generator; it always
//!   starts with all-out and all-in, and never returns the same subset twice.

use crate::rng::Rng;
use ferrite_core::pmem::CACHE_LINE;
use ferrite_core::sim::InFlight;
use std::collections::{BTreeSet, HashSet};

/// A choice of in-flight words to include in a crash image.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Subset {
    /// Nothing in flight reached media.
    None,
    /// Everything in flight reached media.
    All,
    /// Only the words of this cache line (its byte offset) reached media.
    LineIn(u64),
    /// Everything but the words of this cache line reached media.
    LineOut(u64),
    /// Exactly these words (byte offsets) reached media.
    Words(Vec<u64>),
}

impl Subset {
    /// The chosen words of `inf`.
    pub fn select<'a>(&self, inf: &'a [InFlight]) -> Vec<&'a InFlight> {
        let line = |f: &InFlight| f.off / CACHE_LINE * CACHE_LINE;
        match self {
            Subset::None => Vec::new(),
            Subset::All => inf.iter().collect(),
            Subset::LineIn(l) => inf.iter().filter(|f| line(f) == *l).collect(),
            Subset::LineOut(l) => inf.iter().filter(|f| line(f) != *l).collect(),
            Subset::Words(w) => {
                let set: HashSet<u64> = w.iter().copied().collect();
                inf.iter().filter(|f| set.contains(&f.off)).collect()
            }
        }
    }

    /// Offsets named by a `Words` subset that are not in flight in `inf`.
    pub fn missing(&self, inf: &[InFlight]) -> Vec<u64> {
        match self {
            Subset::Words(w) => {
                let have: HashSet<u64> = inf.iter().map(|f| f.off).collect();
                w.iter().copied().filter(|o| !have.contains(o)).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Reproducer form: `none`, `all`, `line-in:0x..`, `line-out:0x..`, `words:0x..+0x..`.
    pub fn spec(&self) -> String {
        match self {
            Subset::None => "none".into(),
            Subset::All => "all".into(),
            Subset::LineIn(l) => format!("line-in:{l:#x}"),
            Subset::LineOut(l) => format!("line-out:{l:#x}"),
            Subset::Words(w) if w.is_empty() => "none".into(),
            Subset::Words(w) => {
                let v: Vec<String> = w.iter().map(|o| format!("{o:#x}")).collect();
                format!("words:{}", v.join("+"))
            }
        }
    }

    /// Parse [`Subset::spec`] output.
    pub fn parse(s: &str) -> Result<Subset, String> {
        let num = |t: &str| -> Result<u64, String> {
            let t = t.trim();
            let r = match t.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => t.parse(),
            };
            r.map_err(|_| format!("bad offset '{t}' in subset"))
        };
        let word = |o: u64| -> Result<u64, String> {
            if o.is_multiple_of(8) {
                Ok(o)
            } else {
                Err(format!("offset {o:#x} is not 8-byte aligned"))
            }
        };
        Ok(match s.split_once(':') {
            None if s == "none" => Subset::None,
            None if s == "all" => Subset::All,
            Some(("line-in", l)) => Subset::LineIn(num(l)? / CACHE_LINE * CACHE_LINE),
            Some(("line-out", l)) => Subset::LineOut(num(l)? / CACHE_LINE * CACHE_LINE),
            Some(("words", w)) => {
                let mut v = Vec::new();
                for t in w.split('+').filter(|t| !t.is_empty()) {
                    v.push(word(num(t)?)?);
                }
                Subset::Words(v)
            }
            _ => {
                return Err(format!(
                    "bad subset '{s}' (expected none, all, line-in:OFF, line-out:OFF or words:OFF+OFF...)"
                ))
            }
        })
    }
}

/// Cache lines (byte offsets) with words in flight, ascending.
pub fn lines(inf: &[InFlight]) -> Vec<u64> {
    let set: BTreeSet<u64> = inf.iter().map(|f| f.off / CACHE_LINE * CACHE_LINE).collect();
    set.into_iter().collect()
}

/// How many subsets a fence point has when explored fully: every subset when at
/// most `enum_max` words are in flight, else the structured ones (all-out, all-in,
/// each line in, each line out) plus `randoms` random subsets.
pub fn natural_count(words: usize, nlines: usize, enum_max: u32, randoms: usize) -> u64 {
    if words == 0 {
        1
    } else if words <= enum_max as usize {
        1u64 << words
    } else {
        2 + nlines as u64 * if nlines > 1 { 2 } else { 1 } + randoms as u64
    }
}

fn mask_subset(inf: &[InFlight], mask: u64) -> Subset {
    Subset::Words(
        inf.iter().enumerate().filter(|(i, _)| mask >> i & 1 == 1).map(|(_, f)| f.off).collect(),
    )
}

/// Up to `quota` distinct subsets for one fence point (see [`natural_count`]):
/// all-out, all-in, then each line in and each line out, then every remaining subset
/// (when at most `enum_max` words are in flight and the quota allows) or random ones.
pub fn plan(inf: &[InFlight], quota: usize, enum_max: u32, rng: &mut Rng) -> Vec<Subset> {
    if inf.is_empty() {
        return vec![Subset::None];
    }
    let quota = quota.max(1);
    let w = inf.len();
    let small = w <= enum_max as usize;
    if small && quota as u64 >= 1u64 << w {
        return (0..1u64 << w)
            .map(|m| match m {
                0 => Subset::None,
                m if m == (1u64 << w) - 1 => Subset::All,
                m => mask_subset(inf, m),
            })
            .collect();
    }
    let mut out = vec![Subset::None];
    if quota >= 2 {
        out.push(Subset::All);
    }
    // Structured subsets, as word sets so duplicates are recognised.
    let key = |s: &Subset| -> Vec<u64> { s.select(inf).iter().map(|f| f.off).collect() };
    let mut seen: HashSet<Vec<u64>> = out.iter().map(key).collect();
    let ls = lines(inf);
    let mut structured: Vec<Subset> = ls.iter().map(|&l| Subset::LineIn(l)).collect();
    if ls.len() > 1 {
        structured.extend(ls.iter().map(|&l| Subset::LineOut(l)));
    }
    structured.retain(|s| seen.insert(key(s)));
    if out.len() + structured.len() > quota {
        // Seeded sample of the structured subsets.
        while out.len() < quota && !structured.is_empty() {
            let i = rng.below(structured.len() as u64) as usize;
            out.push(structured.swap_remove(i));
        }
        return out;
    }
    out.extend(structured);
    let mut tries = 0;
    while out.len() < quota && tries < quota * 8 {
        tries += 1;
        let words: Vec<u64> = if small {
            let m = rng.below(1u64 << w);
            inf.iter().enumerate().filter(|(i, _)| m >> i & 1 == 1).map(|(_, f)| f.off).collect()
        } else {
            inf.iter().filter(|_| rng.chance(1, 2)).map(|f| f.off).collect()
        };
        if seen.insert(words.clone()) {
            out.push(Subset::Words(words));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inf(offs: &[u64]) -> Vec<InFlight> {
        offs.iter().map(|&off| InFlight { off, val: off + 1 }).collect()
    }

    #[test]
    fn spec_roundtrip_and_selection() {
        let v = inf(&[0, 8, 64, 72, 128]);
        for s in [
            Subset::None,
            Subset::All,
            Subset::LineIn(64),
            Subset::LineOut(0),
            Subset::Words(vec![8, 128]),
        ] {
            assert_eq!(Subset::parse(&s.spec()).unwrap(), s);
        }
        assert_eq!(Subset::LineIn(64).select(&v).len(), 2);
        assert_eq!(Subset::LineOut(64).select(&v).len(), 3);
        assert_eq!(Subset::Words(vec![8, 999 * 8]).missing(&v), vec![999 * 8]);
        assert!(Subset::parse("words:0x3").is_err());
        assert!(Subset::parse("bogus").is_err());
    }

    #[test]
    fn plan_enumerates_small_and_samples_large() {
        let mut r = Rng::new(1);
        let small = inf(&[0, 8, 16]);
        let p = plan(&small, 100, 10, &mut r);
        assert_eq!(p.len(), 8);
        let set: HashSet<_> = p.iter().map(|s| s.select(&small).len()).collect();
        assert!(set.contains(&0) && set.contains(&3));
        let p = plan(&small, 5, 10, &mut r);
        assert_eq!(p.len(), 5);
        assert_eq!(&p[..2], &[Subset::None, Subset::All]);
        // Three lines: each line in and each line out, none a duplicate.
        let three = inf(&[0, 64, 72, 128]);
        let p = plan(&three, 10, 10, &mut r);
        assert_eq!(p.len(), 10);
        assert!(p.contains(&Subset::LineIn(64)) && p.contains(&Subset::LineOut(64)));
        let uniq: HashSet<Vec<u64>> =
            p.iter().map(|s| s.select(&three).iter().map(|f| f.off).collect()).collect();
        assert_eq!(uniq.len(), p.len());
        let big: Vec<u64> = (0..40).map(|i| i * 8).collect();
        let big = inf(&big);
        let p = plan(&big, 30, 10, &mut r);
        assert_eq!(p.len(), 30);
        let uniq: HashSet<_> = p.iter().collect();
        assert_eq!(uniq.len(), 30);
        assert!(p.contains(&Subset::LineIn(64)) && p.contains(&Subset::LineOut(128)));
        assert_eq!(natural_count(3, 1, 10, 8), 8);
        assert_eq!(natural_count(40, 5, 10, 8), 2 + 10 + 8);
    }
}
