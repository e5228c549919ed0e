//! `kumo`'s command line and dispatch: the top-level [`Cli`] and its
//! [`Command`]s, each handed to its resource's module. Each resolves its
//! server and token (flags, then `KUMO_SERVER`/`KUMO_TOKEN`, then the
//! profile), calls the API through [`Client`], and prints a table or JSON.
//! The resource modules take shared pieces from [`crate::args`] and
//! [`crate::output`], never from here; the subcommand types are re-exported
//! here so their paths stay as they were.

use std::io::Write;
use std::path::PathBuf;

use anyhow::anyhow;
use clap::{CommandFactory, Parser, Subcommand};

pub use crate::args::{parse_duration, SpecArgs, TenantArg};
pub use crate::clusters::ClusterCmd;
pub use crate::hosts::{DeviceCmd, HostCmd, JoinTokenCmd};
pub use crate::members::MemberCmd;
pub use crate::quota::QuotaCmd;
pub use crate::segments::{SegmentCmd, SegmentKindArg};
pub use crate::templates::TemplateCmd;
pub use crate::tenants::TenantCmd;
pub use crate::tokens::TokenCmd;
pub use crate::users::{UserCmd, UserSessionsCmd};
pub use crate::vms::VmCmd;

use crate::client::Client;
use crate::output::Format;
use crate::profile::{default_path, ProfileFile};

#[derive(Parser, Debug)]
#[command(
    name = "kumo",
    version,
    about = "Command-line client of the Kumo GPU cloud"
)]
pub struct Cli {
    /// API server URL, e.g. http://127.0.0.1:8080.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "KUMO_SERVER"
    )]
    pub server: Option<String>,
    /// API token (kumo_…).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "KUMO_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Profile in the profile file [default: its `current`, else "default"].
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "KUMO_PROFILE"
    )]
    pub profile: Option<String>,
    /// Output format.
    #[arg(
        short = 'o',
        long,
        global = true,
        help_heading = "Global options",
        value_enum,
        default_value = "table"
    )]
    pub output: Format,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Sign in to a server and save it as a profile.
    ///
    /// With an API token (--token), or without one through the portal in a
    /// browser (or, with --device, on another device).
    Login {
        /// The API server's URL, e.g. https://kumo.example.org.
        #[arg(long)]
        server: String,
        /// An API token (kumo_…) to check and save [default: sign in
        /// through the portal, which makes one].
        #[arg(long)]
        token: Option<String>,
        /// Print the sign-in page's address instead of opening a browser.
        #[arg(long)]
        no_browser: bool,
        /// Sign in on another device with a code (OAuth device
        /// authorization grant), for terminals without a browser.
        #[arg(long, conflicts_with_all = ["token", "no_browser"])]
        device: bool,
        /// The institution to sign in at with --device (when the server
        /// has several).
        #[arg(long, requires = "device")]
        provider: Option<String>,
    },
    /// Tenants: the research projects that own VMs, networks and points.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Members of a tenant and their roles.
    #[command(subcommand)]
    Member(MemberCmd),
    /// People and service accounts.
    #[command(subcommand)]
    User(UserCmd),
    /// Your API tokens: create, list, revoke.
    #[command(subcommand)]
    Token(TokenCmd),
    /// A tenant's limits: GPUs, vCPUs, memory, VMs, disks, networks.
    #[command(subcommand)]
    Quota(QuotaCmd),
    /// GPU hosts (platform admins).
    #[command(subcommand)]
    Host(HostCmd),
    /// VM images (templates) and their login users.
    #[command(subcommand)]
    Template(TemplateCmd),
    /// Virtual machines: create, show, reach with SSH, start, stop, delete.
    #[command(subcommand)]
    Vm(VmCmd),
    /// Training clusters: VMs placed together, rail-aligned.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Tenant networks (VXLAN segments) for Ethernet and RoCE.
    #[command(subcommand)]
    Segment(SegmentCmd),
    /// Public addresses: pools, a tenant's addresses, floating IPs.
    #[command(subcommand)]
    PublicIp(crate::public_net::PublicIpCmd),
    /// Forwards from a public address's port to a VM's.
    #[command(subcommand)]
    PortForward(crate::public_net::PortForwardCmd),
    /// Block volumes that outlive VMs: create, attach to a VM on their
    /// host, detach, grow, delete.
    #[command(subcommand)]
    Volume(crate::volumes::VolumeCmd),
    /// Project shares: directories on the filesystem every host mounts,
    /// mounted into VMs and whole clusters (virtiofs).
    #[command(subcommand)]
    Share(crate::shares::ShareCmd),
    /// Reservations: GPUs held for the project over a window, used by
    /// VMs and clusters that name them.
    #[command(subcommand)]
    Reservation(crate::reservations::ReservationCmd),
    /// Idle GPUs: the project's policy and webhook, its idle VMs,
    /// exemptions.
    #[command(subcommand)]
    Idle(crate::idle::IdleCmd),
    /// Rate cards: prices per hour, guaranteed and spot.
    #[command(subcommand)]
    Rate(crate::billing::RateCmd),
    /// A tenant's prepaid points.
    #[command(subcommand)]
    Points(crate::billing::PointsCmd),
    /// Monthly statements.
    #[command(subcommand)]
    Statement(crate::billing::StatementCmd),
    /// Usage over a period, by VM, resource or day.
    #[command(subcommand)]
    Usage(crate::billing::UsageCmd),
    /// Lifecycle events of a tenant's VMs, newest first.
    Events {
        #[command(flatten)]
        tenant: TenantArg,
        /// Show at most this many events.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// The audit log: who did what, newest first.
    Audit {
        /// Only this tenant's entries [default: every one you may see].
        #[arg(long, env = "KUMO_TENANT")]
        tenant: Option<String>,
        /// Show at most this many entries.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Print a shell completion script, e.g. `kumo completions bash`.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

struct Env {
    profile_path: Option<PathBuf>,
    profiles: ProfileFile,
}

fn client(cli: &Cli, env: &Env) -> anyhow::Result<Client> {
    let profile = env.profiles.get(cli.profile.as_deref());
    let server = cli
        .server
        .clone()
        .or_else(|| profile.map(|p| p.server.clone()))
        .ok_or_else(|| anyhow!("no server: pass --server, set KUMO_SERVER, or run `kumo login`"))?;
    let token = cli
        .token
        .clone()
        .or_else(|| profile.and_then(|p| p.token.clone()));
    Ok(Client::new(&server, token)?)
}

/// The server a command line talks to, for hints: `kumo login`'s,
/// `--server` (or `KUMO_SERVER`), else the profile's.
pub fn server_of(cli: &Cli) -> Option<String> {
    if let Command::Login { server, .. } = &cli.command {
        return Some(server.clone());
    }
    cli.server.clone().or_else(|| {
        let profiles = ProfileFile::load(&default_path()?).ok()?;
        profiles
            .get(cli.profile.as_deref())
            .map(|p| p.server.clone())
    })
}

pub async fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    let profile_path = default_path();
    let profiles = match &profile_path {
        Some(p) => ProfileFile::load(p)?,
        None => ProfileFile::default(),
    };
    let env = Env {
        profile_path,
        profiles,
    };
    let fmt = cli.output;
    match &cli.command {
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(*shell, &mut cmd, "kumo", out);
        }
        Command::Login {
            server,
            token,
            no_browser,
            device,
            provider,
        } => {
            let how = match token {
                Some(t) => crate::login::SignIn::Token(t),
                None if *device => crate::login::SignIn::Device {
                    provider: provider.as_deref(),
                },
                None => crate::login::SignIn::Browser {
                    no_browser: *no_browser,
                },
            };
            crate::login::login(
                server,
                how,
                cli.profile.as_deref(),
                env.profile_path.clone(),
                &env.profiles,
                out,
            )
            .await?;
        }
        Command::Tenant(cmd) => crate::tenants::tenant(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Member(cmd) => crate::members::member(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::User(cmd) => crate::users::user(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Token(cmd) => crate::tokens::token(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Quota(cmd) => crate::quota::quota(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Host(cmd) => crate::hosts::host(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Template(cmd) => {
            crate::templates::template(cmd, &client(&cli, &env)?, fmt, out).await?
        }
        Command::Vm(cmd) => crate::vms::vm(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Cluster(cmd) => {
            crate::clusters::cluster(cmd, &client(&cli, &env)?, fmt, out).await?
        }
        Command::Segment(cmd) => {
            crate::segments::segment_cmd(cmd, &client(&cli, &env)?, fmt, out).await?
        }
        Command::PublicIp(cmd) => {
            crate::public_net::public_ip(cmd, &client(&cli, &env)?, fmt, out).await?
        }
        Command::Volume(cmd) => crate::volumes::volume(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Share(cmd) => crate::shares::share(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Reservation(cmd) => {
            crate::reservations::reservation(cmd, &client(&cli, &env)?, fmt, out).await?
        }
        Command::Idle(cmd) => crate::idle::idle(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::PortForward(cmd) => {
            crate::public_net::port_forward(cmd, &client(&cli, &env)?, fmt, out).await?
        }
        Command::Rate(cmd) => crate::billing::rate(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Points(cmd) => crate::billing::points(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Usage(cmd) => crate::billing::usage(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Statement(cmd) => {
            crate::billing::statement(cmd, &client(&cli, &env)?, fmt, out).await?
        }
        Command::Events { tenant, limit } => {
            crate::vms::events(&client(&cli, &env)?, &tenant.tenant, *limit, fmt, out).await?
        }
        Command::Audit { tenant, limit } => {
            crate::audit::audit(&client(&cli, &env)?, tenant.as_deref(), *limit, fmt, out).await?
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
