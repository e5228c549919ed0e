//! `kumo audit`: the audit log, who did what, newest first; one tenant's
//! entries or every one the caller may see.

use std::io::Write;

use crate::client::Client;
use crate::output::{json, opt, Format, Table};

pub async fn audit(
    c: &Client,
    tenant: Option<&str>,
    limit: u32,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let entries = c.audit(tenant, limit).await?;
    if fmt == Format::Json {
        write!(out, "{}", json(&entries))?;
    } else {
        let mut t = Table::new(&[
            "at", "actor", "action", "tenant", "target", "from", "request",
        ]);
        for e in entries {
            t.row(vec![
                e.at.format("%Y-%m-%d %H:%M:%S").to_string(),
                e.actor,
                e.action,
                opt(&e.tenant),
                e.target,
                e.source_ip,
                e.request_id,
            ]);
        }
        write!(out, "{}", t.render())?;
    }
    Ok(())
}
