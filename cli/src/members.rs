//! `kumo member`: a tenant's members and their roles.

use std::io::Write;

use clap::Subcommand;
use kumo_api_types::{MemberPut, Role};

use crate::args::TenantArg;
use crate::client::Client;
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum MemberCmd {
    /// Add a member, or change their role.
    Add {
        /// The user's name.
        user: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// owner (manages members), member (uses resources) or viewer
        /// (reads only).
        #[arg(long, value_parser = parse_role, default_value = "member")]
        role: Role,
    },
    /// Take a member out of the tenant.
    Remove {
        /// The user's name.
        user: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// The tenant's members and their roles.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s).ok_or_else(|| "role must be owner, member or viewer".into())
}

fn members_table(items: &[kumo_api_types::Member]) -> String {
    let mut t = Table::new(&["user", "role", "since"]);
    for m in items {
        t.row(vec![
            m.user.clone(),
            m.role.as_str().into(),
            m.since.format("%Y-%m-%d %H:%M").to_string(),
        ]);
    }
    t.render()
}

pub async fn member(
    cmd: &MemberCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        MemberCmd::Add { user, tenant, role } => {
            let m = c
                .put_member(&tenant.tenant, user, &MemberPut { role: *role })
                .await?;
            print_one(out, fmt, &m, || members_table(std::slice::from_ref(&m)))?;
        }
        MemberCmd::Remove { user, tenant } => {
            c.remove_member(&tenant.tenant, user).await?;
            if fmt == Format::Table {
                writeln!(out, "Removed {user} from {}", tenant.tenant)?;
            }
        }
        MemberCmd::List { tenant } => {
            let ms = c.list_members(&tenant.tenant).await?;
            print_one(out, fmt, &ms, || members_table(&ms))?;
        }
    }
    Ok(())
}
