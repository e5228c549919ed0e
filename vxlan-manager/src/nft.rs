//! The nftables edge: reads and replaces the `bridge kumo` table through
//! nft's JSON API (`nft -j`), in the host's namespace. Only that table is
//! ever read or written.

use serde_json::Value;

use crate::filter::{self, TABLE};
use crate::kernel::{tool, NetError};
use crate::state::DesiredState;

fn nft(
    netns: Option<&str>,
    args: &[&str],
    input: Option<&str>,
) -> Result<(bool, String, String), NetError> {
    tool(netns, "nft", "nftables", args, input)
}

/// What the kernel holds of Kumo's table: each rule's `(chain, comment)`
/// and the named counters.
pub struct Observed {
    pub rules: Vec<(String, String)>,
    pub counters: Vec<filter::Counter>,
}

/// Kumo's table as the kernel holds it, or `None` when there is no table.
pub fn observe(netns: Option<&str>) -> Result<Option<Observed>, NetError> {
    let (ok, out, err) = nft(netns, &["-j", "list", "table", "bridge", TABLE], None)?;
    if !ok {
        // nft says "No such file or directory" for a missing table.
        if err.contains("No such file") {
            return Ok(None);
        }
        return Err(NetError::Tool(err));
    }
    let v: Value = serde_json::from_str(&out)
        .map_err(|e| NetError::Tool(format!("unreadable nft -j output: {e}")))?;
    Ok(Some(Observed {
        rules: filter::listed(&v),
        counters: filter::listed_counters(&v),
    }))
}

/// Makes the table hold exactly the filters of `want`, in one nft
/// transaction; the anti-spoof counters keep their counts. Returns the
/// rules written (0 when already in place).
pub fn converge_filters(netns: Option<&str>, want: &DesiredState) -> Result<usize, NetError> {
    want.validate()?;
    let rules = filter::rules(want);
    let have = observe(netns)?;
    let in_place = match &have {
        None => rules.is_empty(),
        Some(h) => !rules.is_empty() && filter::in_place(&rules, &h.rules),
    };
    if in_place {
        return Ok(0);
    }
    let counters: Vec<filter::Counter> = filter::counters(want)
        .into_iter()
        .map(|name| {
            have.iter()
                .flat_map(|h| &h.counters)
                .find(|c| c.name == name)
                .cloned()
                .unwrap_or(filter::Counter {
                    name,
                    packets: 0,
                    bytes: 0,
                })
        })
        .collect();
    let cmds = filter::commands(&rules, &counters, have.is_some()).to_string();
    let (ok, _, err) = nft(netns, &["-j", "-f", "-"], Some(&cmds))?;
    if !ok {
        return Err(NetError::Tool(err));
    }
    Ok(rules.len().max(1))
}

/// A segment's anti-spoof drops on this host so far (`None`: the segment
/// has no filter here).
pub fn spoofed(netns: Option<&str>, vni: u32) -> Result<Option<u64>, NetError> {
    let name = filter::spoof_counter(vni);
    Ok(observe(netns)?.and_then(|h| {
        h.counters
            .into_iter()
            .find(|c| c.name == name)
            .map(|c| c.packets)
    }))
}
