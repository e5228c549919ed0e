//! `kumo user`: people and service accounts, who you are, locking users out
//! and ending their portal sessions.

use std::io::Write;

use clap::Subcommand;
use kumo_api_types::{UserCreate, UserKind};

use crate::client::Client;
use crate::output::{opt, print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum UserCmd {
    /// Create a user (platform admins).
    Create {
        /// Their user name.
        name: String,
        /// Their name for people.
        #[arg(long)]
        display_name: Option<String>,
        /// Their e-mail address.
        #[arg(long)]
        email: Option<String>,
        /// A service account for automation.
        #[arg(long)]
        service: bool,
        /// A platform administrator.
        #[arg(long)]
        admin: bool,
    },
    /// Every user (platform admins).
    List,
    /// Who am I, and where do I belong.
    Me,
    /// Lock a user out: their tokens fail at once and their portal
    /// sessions end (admins).
    Disable {
        /// The user's name.
        name: String,
    },
    /// Let a disabled user in again (admins).
    Enable {
        /// The user's name.
        name: String,
    },
    /// Portal sessions.
    #[command(subcommand)]
    Sessions(UserSessionsCmd),
}

#[derive(Subcommand, Debug)]
pub enum UserSessionsCmd {
    /// Sign every browser of the user out (admins, or yourself).
    End {
        /// The user's name.
        name: String,
    },
}

fn users_table(items: &[kumo_api_types::User]) -> String {
    let mut t = Table::new(&["name", "display name", "kind", "admin", "email"]);
    for u in items {
        t.row(vec![
            if u.disabled {
                format!("{} (disabled)", u.name)
            } else {
                u.name.clone()
            },
            u.display_name.clone(),
            u.kind.as_str().into(),
            if u.is_admin { "yes" } else { "no" }.into(),
            opt(&u.email),
        ]);
    }
    t.render()
}

pub async fn user(
    cmd: &UserCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        UserCmd::Create {
            name,
            display_name,
            email,
            service,
            admin,
        } => {
            let u = c
                .create_user(&UserCreate {
                    name: name.clone(),
                    display_name: display_name.clone(),
                    email: email.clone(),
                    kind: Some(if *service {
                        UserKind::Service
                    } else {
                        UserKind::Local
                    }),
                    is_admin: *admin,
                })
                .await?;
            print_one(out, fmt, &u, || users_table(std::slice::from_ref(&u)))?;
        }
        UserCmd::List => {
            let us = c.list_users().await?;
            print_one(out, fmt, &us, || users_table(&us))?;
        }
        UserCmd::Disable { name } | UserCmd::Enable { name } => {
            let disable = matches!(cmd, UserCmd::Disable { .. });
            let u = c.set_user_disabled(name, disable).await?;
            print_one(out, fmt, &u, || users_table(std::slice::from_ref(&u)))?;
        }
        UserCmd::Sessions(UserSessionsCmd::End { name }) => {
            c.end_sessions(name).await?;
            if fmt == Format::Table {
                writeln!(out, "Ended every portal session of {name}")?;
            }
        }
        UserCmd::Me => {
            let me = c.me().await?;
            print_one(out, fmt, &me, || {
                let mut s = users_table(std::slice::from_ref(&me.user));
                let mut t = Table::new(&["tenant", "role"]);
                for m in &me.memberships {
                    t.row(vec![m.tenant.clone(), m.role.as_str().into()]);
                }
                s.push('\n');
                s.push_str(&t.render());
                s
            })?;
        }
    }
    Ok(())
}
