//! `kumo tenant`: the research projects that own VMs, networks and points.

use std::io::Write;

use clap::Subcommand;
use kumo_api_types::{TenantCreate, TenantUpdate};

use crate::client::Client;
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum TenantCmd {
    /// Create a tenant (platform admins).
    Create {
        /// Its name: lower-case letters, digits and dashes.
        name: String,
        /// A name for people [default: the name].
        #[arg(long)]
        display_name: Option<String>,
        /// What the project is about.
        #[arg(long)]
        description: Option<String>,
    },
    /// The tenants you belong to (every one, for platform admins).
    List,
    /// One tenant's details.
    Show {
        /// Tenant name or id.
        tenant: String,
    },
    /// Change a tenant's display name or description.
    Update {
        /// Tenant name or id.
        tenant: String,
        /// The new name for people.
        #[arg(long)]
        display_name: Option<String>,
        /// The new description.
        #[arg(long)]
        description: Option<String>,
    },
    /// Delete a tenant (platform admins).
    Delete {
        /// Tenant name or id.
        tenant: String,
    },
}

fn tenants_table(items: &[kumo_api_types::Tenant]) -> String {
    let mut t = Table::new(&["name", "display name", "id", "created"]);
    for x in items {
        t.row(vec![
            x.name.clone(),
            x.display_name.clone(),
            x.id.to_string(),
            x.created_at.format("%Y-%m-%d %H:%M").to_string(),
        ]);
    }
    t.render()
}

pub async fn tenant(
    cmd: &TenantCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        TenantCmd::Create {
            name,
            display_name,
            description,
        } => {
            let t = c
                .create_tenant(&TenantCreate {
                    name: name.clone(),
                    display_name: display_name.clone(),
                    description: description.clone(),
                })
                .await?;
            print_one(out, fmt, &t, || tenants_table(std::slice::from_ref(&t)))?;
        }
        TenantCmd::List => {
            let ts = c.list_tenants().await?;
            print_one(out, fmt, &ts, || tenants_table(&ts))?;
        }
        TenantCmd::Show { tenant } => {
            let t = c.tenant(tenant).await?;
            print_one(out, fmt, &t, || {
                format!(
                    "Name:         {}\nDisplay name: {}\nId:           {}\nDescription:  {}\nCreated:      {}\n",
                    t.name, t.display_name, t.id, t.description, t.created_at
                )
            })?;
        }
        TenantCmd::Update {
            tenant,
            display_name,
            description,
        } => {
            let t = c
                .update_tenant(
                    tenant,
                    &TenantUpdate {
                        display_name: display_name.clone(),
                        description: description.clone(),
                    },
                )
                .await?;
            print_one(out, fmt, &t, || tenants_table(std::slice::from_ref(&t)))?;
        }
        TenantCmd::Delete { tenant } => {
            c.delete_tenant(tenant).await?;
            if fmt == Format::Table {
                writeln!(out, "Deleted tenant {tenant}")?;
            }
        }
    }
    Ok(())
}
