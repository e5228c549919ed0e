//! `kumo token`: your API tokens (made for yourself, or by admins for
//! another user), listed without their secrets, and revoked.

use std::io::Write;

use anyhow::anyhow;
use clap::Subcommand;
use kumo_api_types::TokenCreate;

use crate::args::parse_duration;
use crate::client::Client;
use crate::output::{opt, print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Make a token; it is shown only once.
    Create {
        /// What the token is for.
        #[arg(long)]
        description: Option<String>,
        /// Lifetime, e.g. 90d, 12h, 30m.
        #[arg(long, value_parser = parse_duration)]
        expires_in: Option<u64>,
        /// Mint for this user instead of yourself (admins).
        #[arg(long)]
        user: Option<String>,
    },
    /// Your tokens (never their secrets).
    List,
    /// Make a token fail from now on.
    Revoke {
        /// The token's id (see kumo token list).
        id: String,
    },
}

pub async fn token(
    cmd: &TokenCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        TokenCmd::Create {
            description,
            expires_in,
            user,
        } => {
            let expires_at = match expires_in {
                Some(secs) => {
                    let secs =
                        i64::try_from(*secs).map_err(|_| anyhow!("--expires-in is too long"))?;
                    let lifetime = chrono::Duration::try_seconds(secs)
                        .ok_or_else(|| anyhow!("--expires-in is too long"))?;
                    Some(
                        chrono::Utc::now()
                            .checked_add_signed(lifetime)
                            .ok_or_else(|| anyhow!("--expires-in is too long"))?,
                    )
                }
                None => None,
            };
            let body = TokenCreate {
                description: description.clone(),
                expires_at,
            };
            let created = match user {
                Some(u) => c.create_token_for(u, &body).await?,
                None => c.create_token(&body).await?,
            };
            print_one(out, fmt, &created, || {
                format!(
                    "Token {} (expires {}). It is shown only once:\n{}\n",
                    created.id,
                    opt(&created.expires_at),
                    created.token
                )
            })?;
        }
        TokenCmd::List => {
            let ts = c.list_tokens().await?;
            print_one(out, fmt, &ts, || {
                let mut t = Table::new(&["id", "description", "created", "expires", "last used"]);
                for x in &ts {
                    t.row(vec![
                        x.id.to_string(),
                        x.description.clone(),
                        x.created_at.format("%Y-%m-%d %H:%M").to_string(),
                        opt(&x.expires_at.map(|e| e.format("%Y-%m-%d %H:%M").to_string())),
                        opt(&x
                            .last_used_at
                            .map(|e| e.format("%Y-%m-%d %H:%M").to_string())),
                    ]);
                }
                t.render()
            })?;
        }
        TokenCmd::Revoke { id } => {
            c.revoke_token(id).await?;
            if fmt == Format::Table {
                writeln!(out, "Revoked token {id}")?;
            }
        }
    }
    Ok(())
}
