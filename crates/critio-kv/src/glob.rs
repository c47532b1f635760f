//! Redis's glob patterns (`stringmatchlen`), for KEYS, SCAN's `MATCH` and
//! CONFIG GET: `*` any run, `?` any one byte, `[abc]`, `[^a-z]`, `\x` a
//! literal. Iterative with one backtrack point (the last `*`), so a match
//! costs O(pattern × text) at worst, however many stars a client sends.

/// Whether `text` matches `pattern` (`nocase`: ASCII case ignored).
pub fn matches(pattern: &[u8], text: &[u8], nocase: bool) -> bool {
    let eq = |a: u8, b: u8| {
        if nocase {
            a.eq_ignore_ascii_case(&b)
        } else {
            a == b
        }
    };
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                while pattern.get(p) == Some(&b'*') {
                    p += 1;
                }
                if p == pattern.len() {
                    return true;
                }
                star = Some((p, t));
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => class(pattern, p, text[t], nocase),
            Some(b'\\') if p + 1 < pattern.len() => eq(pattern[p + 1], text[t]).then_some(p + 2),
            Some(&c) => eq(c, text[t]).then_some(p + 1),
            None => None,
        };
        match step {
            Some(next) => {
                p = next;
                t += 1;
            }
            None => match star {
                // Let the last star take one more byte and try again.
                Some((sp, st)) => {
                    p = sp;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class starting at `pattern[at] == b'['`:
/// Some(the position after it) if it matches. An unclosed class runs to
/// the end of the pattern, as in Redis.
fn class(pattern: &[u8], at: usize, c: u8, nocase: bool) -> Option<usize> {
    let eq = |a: u8, b: u8| {
        if nocase {
            a.eq_ignore_ascii_case(&b)
        } else {
            a == b
        }
    };
    let mut p = at + 1;
    let not = pattern.get(p) == Some(&b'^');
    if not {
        p += 1;
    }
    let mut hit = false;
    while p < pattern.len() && pattern[p] != b']' {
        if pattern[p] == b'\\' && p + 1 < pattern.len() {
            hit |= eq(pattern[p + 1], c);
            p += 2;
        } else if p + 2 < pattern.len() && pattern[p + 1] == b'-' && pattern[p + 2] != b']' {
            let (mut lo, mut hi) = (pattern[p], pattern[p + 2]);
            if lo > hi {
                std::mem::swap(&mut lo, &mut hi);
            }
            let (lc, uc) = (c.to_ascii_lowercase(), c.to_ascii_uppercase());
            hit |= (lo..=hi).contains(&c);
            if nocase {
                hit |= (lo..=hi).contains(&lc) || (lo..=hi).contains(&uc);
            }
            p += 3;
        } else {
            hit |= eq(pattern[p], c);
            p += 1;
        }
    }
    let end = (p + 1).min(pattern.len());
    (hit != not).then_some(end)
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns_match_like_redis() {
        let m = |p: &str, t: &str| matches(p.as_bytes(), t.as_bytes(), false);
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("user:*", "user:42"));
        assert!(!m("user:*", "order:42"));
        assert!(m("h?llo", "hello") && m("h?llo", "hallo") && !m("h?llo", "hllo"));
        assert!(m("h[ae]llo", "hallo") && !m("h[ae]llo", "hillo"));
        assert!(m("h[^e]llo", "hallo") && !m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo") && !m("h[a-b]llo", "hcllo"));
        assert!(m("a\\*b", "a*b") && !m("a\\*b", "axb"));
        assert!(m("*o*y", "maxmemory-policy"));
        assert!(!m("GET", "get"));
        assert!(matches(b"GET", b"get", true));
        assert!(matches(b"max*", b"MAXMEMORY", true));
        assert!(m("a*b*c", "a-b-b-c") && !m("a*b*c", "a-b-b-"));
        // Many stars do not blow up.
        let pat = "*a".repeat(50) + "b";
        assert!(!m(&pat, &"a".repeat(5000)));
    }
}
