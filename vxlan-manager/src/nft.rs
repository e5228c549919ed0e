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

/// The `(chain, comment)` of each rule in Kumo's table, or `None` when
/// there is no table.
pub fn observe(netns: Option<&str>) -> Result<Option<Vec<(String, String)>>, NetError> {
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
    Ok(Some(filter::listed(&v)))
}

/// Makes the table hold exactly the filters of `want`, in one nft
/// transaction. Returns the rules written (0 when already in place).
pub fn converge_filters(netns: Option<&str>, want: &DesiredState) -> Result<usize, NetError> {
    want.validate()?;
    let rules = filter::rules(want);
    let have = observe(netns)?;
    let in_place = match &have {
        None => rules.is_empty(),
        Some(h) => !rules.is_empty() && filter::in_place(&rules, h),
    };
    if in_place {
        return Ok(0);
    }
    let cmds = filter::commands(&rules, have.is_some()).to_string();
    let (ok, _, err) = nft(netns, &["-j", "-f", "-"], Some(&cmds))?;
    if !ok {
        return Err(NetError::Tool(err));
    }
    Ok(rules.len().max(1))
}
