//! `kumo login`: sign in to a server (with a token, in a browser through
//! the portal, or with a code on another device), check the token, and
//! save the server and token as a profile.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{anyhow, Context};

use crate::client::Client;
use crate::profile::{Profile, ProfileFile};

/// How `kumo login` gets its token.
pub enum SignIn<'a> {
    /// `--token`: the caller has one.
    Token(&'a str),
    /// `--device`: a code entered on another device, at `provider`.
    Device { provider: Option<&'a str> },
    /// The portal in a browser (only its address printed with
    /// `--no-browser`).
    Browser { no_browser: bool },
}

/// Signs in to `server` and saves it as the profile `profile` (default
/// "default", made current) in `profiles`, written to `profile_path`.
pub async fn login(
    server: &str,
    how: SignIn<'_>,
    profile: Option<&str>,
    profile_path: Option<PathBuf>,
    profiles: &ProfileFile,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let token = match how {
        SignIn::Token(t) => t.to_owned(),
        SignIn::Device { provider } => crate::device_login::run(server, provider, out).await?,
        SignIn::Browser { no_browser } => {
            crate::browser_login::run(server, no_browser, out).await?
        }
    };
    let c = Client::new(server, Some(token.clone()))?;
    let me = c
        .me()
        .await
        .context("the server did not accept this token")?;
    let path = profile_path
        .ok_or_else(|| anyhow!("cannot find a config directory: set HOME or KUMO_CLI_CONFIG"))?;
    let mut profiles = profiles.clone();
    let name = profile
        .map(str::to_owned)
        .unwrap_or_else(|| "default".into());
    profiles.profiles.insert(
        name.clone(),
        Profile {
            server: c.base().to_owned(),
            token: Some(token.clone()),
        },
    );
    profiles.current = Some(name.clone());
    profiles.save(&path)?;
    writeln!(
        out,
        "Logged in to {} as {} (profile {name:?}, saved in {})",
        c.base(),
        me.user.name,
        path.display()
    )?;
    Ok(())
}
