//! What agents say they could not set up: a host's unconverged segments,
//! by VNI, with why. The text comes from a host's kernel and tools, so it
//! is cleaned and bounded here; nothing an agent says about faults can
//! fail its heartbeat.

use std::collections::BTreeMap;

/// At most this many faults are kept per host (a host carries at most a
/// few hundred segments; more is noise).
pub const MAX_FAULTS: usize = 256;
/// Each fault's message is cut to this many characters.
pub const MAX_MESSAGE: usize = 300;

/// The VNIs a VXLAN header can carry.
const VNIS: std::ops::RangeInclusive<u32> = 1..=16_777_215;

/// The stored form of a heartbeat's faults: cleaned, bounded JSON, or
/// `None` when every segment converged.
pub fn stored(faults: &BTreeMap<u32, String>) -> Option<String> {
    let kept: BTreeMap<u32, String> = faults
        .iter()
        .filter(|(vni, _)| VNIS.contains(vni))
        .take(MAX_FAULTS)
        .map(|(vni, m)| (*vni, clean(m)))
        .collect();
    if kept.is_empty() {
        return None;
    }
    serde_json::to_string(&kept).ok()
}

/// A host's stored faults; a value that does not parse counts as none.
pub fn read(stored: Option<&str>) -> BTreeMap<u32, String> {
    stored
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

fn clean(message: &str) -> String {
    message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_MESSAGE)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_cleaned_bounded_and_empty_is_none() {
        assert_eq!(stored(&BTreeMap::new()), None);
        let mut f = BTreeMap::new();
        f.insert(0, "no such VNI".to_owned());
        f.insert(20_000_000, "nor this".to_owned());
        assert_eq!(stored(&f), None);
        f.insert(100, format!("bad\u{1b}[2Jthing\n{}", "x".repeat(1000)));
        let kept = read(stored(&f).as_deref());
        assert_eq!(kept.len(), 1);
        let m = &kept[&100];
        assert!(m.starts_with("bad [2Jthing "), "{m}");
        assert_eq!(m.chars().count(), MAX_MESSAGE);
        let many: BTreeMap<u32, String> = (1..=1000).map(|v| (v, "x".to_owned())).collect();
        assert_eq!(read(stored(&many).as_deref()).len(), MAX_FAULTS);
        assert!(read(Some("not json")).is_empty());
    }
}
