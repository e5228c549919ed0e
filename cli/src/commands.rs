//! `kumo`'s commands. Each resolves its server and token (flags, then
//! `KUMO_SERVER`/`KUMO_TOKEN`, then the profile), calls the API through
//! [`Client`], and prints a table or JSON.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use clap::{Args, CommandFactory, Parser, Subcommand};
use kumo_api_types::{
    Cluster, ClusterCreate, IngressRule, JoinTokenCreate, MemberPut, NetworkRequest, Quota,
    ReclaimAction, Role, Segment, SegmentCreate, SegmentIngress, SegmentKind, SegmentUpdate,
    ServiceLevel, TemplateCreate, TenantCreate, TenantUpdate, TokenCreate, UserCreate, UserKind,
    Vm, VmCreate, VmState,
};

use crate::client::Client;
use crate::output::{json, opt, Format, Table};
use crate::profile::{default_path, Profile, ProfileFile};

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

#[derive(Args, Debug)]
pub struct TenantArg {
    /// Tenant name or id.
    #[arg(long, short = 't', env = "KUMO_TENANT")]
    pub tenant: String,
}

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

#[derive(Subcommand, Debug)]
pub enum QuotaCmd {
    /// The tenant's limits.
    Show {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Every GPU model's guaranteed shares against its GPUs in service
    /// (platform admins).
    Guarantees,
    /// Change the given limits; others keep their value (platform admins).
    Set {
        #[command(flatten)]
        tenant: TenantArg,
        /// GPUs per model, e.g. --gpus H100-SXM5-80GB=16 (0 removes the model).
        #[arg(long, value_parser = parse_gpu_limit)]
        gpus: Vec<(String, u32)>,
        /// GPUs per model guaranteed to the tenant, e.g. --guarantee
        /// H100-SXM5-80GB=16 (at most the cap; 0 removes it): requests within
        /// it get room by reclaiming other tenants' borrowed VMs.
        #[arg(long, value_parser = parse_gpu_limit)]
        guarantee: Vec<(String, u32)>,
        /// vCPUs over all the tenant's VMs.
        #[arg(long)]
        vcpus: Option<u32>,
        /// Memory over all the tenant's VMs, GiB.
        #[arg(long)]
        memory_gib: Option<u32>,
        /// How many VMs the tenant may have.
        #[arg(long)]
        vms: Option<u32>,
        /// Disk over all the tenant's VMs, GiB.
        #[arg(long)]
        disk_gib: Option<u32>,
        /// How many segments (private networks) the tenant may have.
        #[arg(long)]
        segments: Option<u32>,
        /// RoCE segments (each holds a fabric VLAN).
        #[arg(long)]
        roce_segments: Option<u32>,
        /// How many public addresses the tenant may hold.
        #[arg(long)]
        public_ips: Option<u32>,
        /// Volumes over all the tenant's volumes, GiB.
        #[arg(long)]
        volume_gib: Option<u32>,
        /// Project shares' sizes together, GiB.
        #[arg(long)]
        share_gib: Option<u32>,
    },
}

#[derive(Subcommand, Debug)]
pub enum HostCmd {
    /// Every host with its GPUs, state and last heartbeat.
    List,
    /// A host with its GPU/NIC matrix and allocations.
    Show {
        /// The host's name.
        host: String,
    },
    /// Take a host out of service: no new VMs; its spot VMs are reclaimed.
    Drain {
        /// The host's name.
        host: String,
    },
    /// Put a drained host back into service.
    Undrain {
        /// The host's name.
        host: String,
    },
    /// Schedule a maintenance window: the host takes nothing new; at TIME
    /// its VMs move to other hosts with their disks (cluster members are
    /// replaced, the rest stopped), and it stays in maintenance until
    /// --done. Every VM on it is told ahead (also in the guest, in
    /// /run/kumo/events).
    Maintenance {
        /// The host's name.
        host: String,
        /// When (RFC 3339, e.g. 2026-12-01T09:00:00Z); again to move it.
        #[arg(long, required_unless_present = "done", conflicts_with = "done")]
        at: Option<chrono::DateTime<chrono::Utc>>,
        /// Told to the tenants whose VMs move.
        #[arg(long, requires = "at")]
        reason: Option<String>,
        /// Maintenance is over (or called off): the host takes VMs again.
        #[arg(long)]
        done: bool,
    },
    /// Let a registered host join again with a join token (a reinstalled
    /// machine); its current credential is revoked at once.
    Rejoin {
        /// The host's name.
        host: String,
    },
    /// Join tokens, which register new hosts.
    #[command(subcommand)]
    JoinToken(JoinTokenCmd),
    /// The health of the GPUs and NICs passed to VMs: list, quarantine,
    /// repair and validate them.
    #[command(subcommand)]
    Device(DeviceCmd),
}

#[derive(Subcommand, Debug)]
pub enum DeviceCmd {
    /// Devices with their state and why (every host's, or one's).
    List {
        /// Only this host's devices.
        #[arg(long)]
        host: Option<String>,
        /// Only devices in this state: healthy, suspect, quarantined,
        /// repairing, validating.
        #[arg(long)]
        state: Option<String>,
    },
    /// Take a device out of service: no new VMs; its spot VMs are reclaimed.
    Quarantine {
        /// The device's host.
        host: String,
        /// Its PCI address, e.g. 0000:18:00.0.
        bdf: String,
        /// Why (kept with the device and in the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Mark a quarantined device as being repaired.
    Repair {
        /// The device's host.
        host: String,
        /// Its PCI address, e.g. 0000:18:00.0.
        bdf: String,
        /// Why (kept with the device and in the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Validate a repaired device: its next clean reading makes it healthy
    /// (a finding quarantines it again).
    Validate {
        /// The device's host.
        host: String,
        /// Its PCI address, e.g. 0000:18:00.0.
        bdf: String,
        /// Why (kept with the device and in the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum JoinTokenCmd {
    /// Make a join token; it is shown only once.
    Create {
        /// What (which machines) it is for.
        #[arg(long)]
        description: Option<String>,
        /// Lifetime, e.g. 24h (default), 7d.
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<u64>,
        /// How many hosts it may register (default 1).
        #[arg(long)]
        uses: Option<u32>,
    },
    /// Join tokens with their uses (never their secrets).
    List,
    /// Revoke a join token: it registers no more hosts.
    Revoke {
        /// The join token's id (see kumo host join-token list).
        id: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum TemplateCmd {
    /// Add a VM image (platform admins).
    Create {
        /// The template's name, as `kumo vm create --template` takes it.
        name: String,
        /// Base qcow2 image path on the hosts.
        #[arg(long)]
        image: String,
        /// The operating system, e.g. ubuntu-24.04.
        #[arg(long)]
        os: String,
        /// The user SSH logs in as (`kumo vm ssh` uses it).
        #[arg(long)]
        default_user: String,
        /// Boot this kernel directly instead of the disk's boot loader.
        #[arg(long)]
        kernel: Option<String>,
        /// The initrd for --kernel (a path on the hosts).
        #[arg(long, requires = "kernel")]
        initrd: Option<String>,
        /// The kernel command line for --kernel.
        #[arg(long, requires = "kernel")]
        cmdline: Option<String>,
    },
    /// The VM images, with their OS and login user.
    List,
}

// What one VM is made of, for `vm create` and each member of a
// `cluster create`. Its doc comment would become their about text: keep
// `//` comments here.
#[derive(Args, Debug)]
pub struct SpecArgs {
    /// GPUs passed through to the VM.
    #[arg(long, default_value_t = 0)]
    gpus: u32,
    /// The GPU model, e.g. H100-SXM5-80GB [default: any].
    #[arg(long)]
    gpu_model: Option<String>,
    /// Virtual CPUs [default: 8 per GPU, at least 2].
    #[arg(long)]
    vcpus: Option<u32>,
    /// Memory, GiB [default: 48 per GPU, at least 4].
    #[arg(long)]
    memory: Option<u32>,
    /// Root disk, GiB [default: 50].
    #[arg(long)]
    disk: Option<u32>,
    /// The VM image, e.g. ubuntu-24.04 (see kumo template list).
    #[arg(long)]
    template: Option<String>,
    /// Cheaper, and reclaimable when guaranteed capacity is needed.
    #[arg(long)]
    spot: bool,
    /// An OpenSSH public key file; repeat for more.
    #[arg(long)]
    ssh_key: Vec<PathBuf>,
    /// Attach to a segment: `SEGMENT` or `SEGMENT=IP`; repeat for more NICs.
    #[arg(long, value_parser = parse_network)]
    network: Vec<NetworkRequest>,
    /// Attach an available volume (repeat for more): the VM goes on the
    /// volume's host.
    #[arg(long)]
    volume: Vec<String>,
    /// Mount a project share: `NAME[:/PATH][:ro]` (default path
    /// `/mnt/NAME`); repeat for more. Clusters mount it in every member.
    #[arg(long, value_parser = kumo_api_types::ShareMountRequest::parse)]
    share: Vec<kumo_api_types::ShareMountRequest>,
    /// With --spot: `shelve` keeps its disk and volumes when it is
    /// reclaimed (`kumo vm unshelve` brings it back) instead of shutting it
    /// down for good.
    #[arg(long, value_parser = parse_reclaim, requires = "spot")]
    on_reclaim: Option<ReclaimAction>,
    /// What its host lost for good does to it: `wait` (it is `lost`, free
    /// of charge, until the host returns; the default) or `recreate` (made
    /// again on another host from its template, with a fresh root disk).
    #[arg(long, value_parser = parse_host_loss)]
    on_host_loss: Option<kumo_api_types::HostLossAction>,
    /// How long the guest has between a notice and the shutdown (e.g.
    /// 10m, to checkpoint), within the platform's bound: a spot VM's
    /// reclaim notice, and for any VM the least warning a maintenance
    /// window gives it.
    #[arg(long, value_parser = parse_duration)]
    notice: Option<u64>,
}

fn parse_single_su(s: &str) -> Result<kumo_api_types::SingleSu, String> {
    kumo_api_types::SingleSu::parse(s).ok_or_else(|| "preferred or required".to_owned())
}

fn parse_host_loss(s: &str) -> Result<kumo_api_types::HostLossAction, String> {
    match s {
        "wait" => Ok(kumo_api_types::HostLossAction::Wait),
        "recreate" => Ok(kumo_api_types::HostLossAction::Recreate),
        _ => Err(format!("{s:?}: wait or recreate")),
    }
}

fn parse_reclaim(s: &str) -> Result<ReclaimAction, String> {
    match s {
        "shelve" => Ok(ReclaimAction::Shelve),
        "shut-down" | "shutdown" => Ok(ReclaimAction::ShutDown),
        _ => Err(format!("{s:?}: shelve or shut-down")),
    }
}

/// `tcp:22:0.0.0.0/0`, `udp:8000-8100:10.0.0.0/8`, `icmp:10.0.0.0/8`, `any:192.0.2.0/24`.
fn parse_ingress(s: &str) -> Result<IngressRule, String> {
    s.parse()
}

fn parse_network(s: &str) -> Result<NetworkRequest, String> {
    let (segment, ip) = match s.split_once('=') {
        Some((seg, ip)) => (seg, Some(ip.to_owned())),
        None => (s, None),
    };
    if segment.is_empty() {
        return Err(format!("{s:?}: expected SEGMENT or SEGMENT=IP"));
    }
    Ok(NetworkRequest {
        segment: segment.to_owned(),
        ip,
    })
}

impl SpecArgs {
    fn vm(&self, name: &str) -> anyhow::Result<VmCreate> {
        let mut keys = Vec::new();
        for f in &self.ssh_key {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned),
            );
        }
        Ok(VmCreate {
            name: name.to_owned(),
            gpus: self.gpus,
            gpu_model: self.gpu_model.clone(),
            vcpus: self.vcpus,
            memory_gib: self.memory,
            disk_gib: self.disk,
            template: self.template.clone(),
            service_level: if self.spot {
                ServiceLevel::Spot
            } else {
                ServiceLevel::Guaranteed
            },
            ssh_keys: keys,
            networks: self.network.clone(),
            volumes: self.volume.clone(),
            shares: self.share.clone(),
            on_reclaim: self.on_reclaim,
            on_host_loss: self.on_host_loss,
            notice_seconds: self.notice.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        })
    }
}

#[derive(Subcommand, Debug)]
pub enum SegmentCmd {
    /// A private network for the tenant's VMs, with a VNI of its own.
    Create {
        /// The segment's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// ethernet (virtio NICs over VXLAN) or roce (the GPUs' RDMA NICs).
        #[arg(long, value_enum, default_value = "ethernet")]
        kind: SegmentKindArg,
        /// IPv4 network, e.g. 10.1.0.0/24.
        #[arg(long)]
        cidr: String,
        /// The gateway address [default: the network's first address].
        #[arg(long)]
        gateway: Option<String>,
        /// The VMs' MTU [default: the underlay MTU less 50].
        #[arg(long)]
        mtu: Option<u32>,
        /// Let in from outside the segment: `PROTO[:PORTS]:SOURCE`, e.g.
        /// `tcp:22:0.0.0.0/0`, `icmp:10.0.0.0/8`; repeat for more.
        #[arg(long, value_parser = parse_ingress)]
        allow: Vec<IngressRule>,
        /// No way out: the VMs reach only the segment (and what reaches
        /// them through public addresses).
        #[arg(long)]
        no_egress: bool,
    },
    /// Switch a segment's egress (VMs reaching outside through its gateway).
    Update {
        /// The segment's name.
        segment: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// true: the VMs reach outside; false: only the segment.
        #[arg(long, value_parser = clap::value_parser!(bool))]
        egress: Option<bool>,
    },
    /// Replace a segment's ingress rules (none: only the segment itself).
    Ingress {
        /// The segment's name.
        segment: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// `PROTO[:PORTS]:SOURCE`; repeat for more.
        #[arg(long, value_parser = parse_ingress)]
        allow: Vec<IngressRule>,
    },
    /// The tenant's segments.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// One segment: its network, VNI, VMs, egress and ingress.
    Show {
        /// The segment's name.
        segment: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Delete a segment without VMs on it.
    Delete {
        /// The segment's name.
        segment: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum SegmentKindArg {
    Ethernet,
    Roce,
}

fn segments_table(segs: &[Segment]) -> String {
    let mut t = Table::new(&[
        "name", "kind", "cidr", "gateway", "mtu", "vni", "vms", "egress", "ingress",
    ]);
    for s in segs {
        t.row(vec![
            s.name.clone(),
            match s.kind {
                SegmentKind::Ethernet => "ethernet".into(),
                SegmentKind::Roce => format!("roce (path MTU {})", s.roce_mtu.unwrap_or(0)),
            },
            s.cidr.clone(),
            s.gateway.clone(),
            s.mtu.to_string(),
            s.vni.to_string(),
            s.attachments.to_string(),
            match (&s.edge, s.egress) {
                (_, false) => "off".into(),
                (Some(e), true) => e
                    .snat_address
                    .clone()
                    .unwrap_or_else(|| "waiting for an address".into()),
                (None, true) => "waiting for an edge".into(),
            },
            if s.ingress.is_empty() {
                "segment only".into()
            } else {
                s.ingress
                    .iter()
                    .map(|r| {
                        let proto = serde_json::to_value(r.protocol)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default();
                        match &r.ports {
                            Some(p) => format!("{proto}:{p}:{}", r.source),
                            None => format!("{proto}:{}", r.source),
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        ]);
    }
    t.render()
}

async fn segment_cmd(
    cmd: &SegmentCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        SegmentCmd::Create {
            name,
            tenant,
            kind,
            cidr,
            gateway,
            mtu,
            allow,
            no_egress,
        } => {
            let s = c
                .create_segment(
                    &tenant.tenant,
                    &SegmentCreate {
                        name: name.clone(),
                        kind: match kind {
                            SegmentKindArg::Ethernet => SegmentKind::Ethernet,
                            SegmentKindArg::Roce => SegmentKind::Roce,
                        },
                        cidr: cidr.clone(),
                        gateway: gateway.clone(),
                        mtu: *mtu,
                        ingress: allow.clone(),
                        egress: no_egress.then_some(false),
                    },
                )
                .await?;
            print_one(out, fmt, &s, || segments_table(std::slice::from_ref(&s)))?;
        }
        SegmentCmd::List { tenant } => {
            let segs = c.list_segments(&tenant.tenant).await?;
            print_one(out, fmt, &segs, || segments_table(&segs))?;
        }
        SegmentCmd::Show { segment, tenant } => {
            let s = c.segment(&tenant.tenant, segment).await?;
            print_one(out, fmt, &s, || segments_table(std::slice::from_ref(&s)))?;
        }
        SegmentCmd::Update {
            segment,
            tenant,
            egress,
        } => {
            if egress.is_none() {
                bail!("nothing to change: give --egress true|false");
            }
            let s = c
                .update_segment(&tenant.tenant, segment, &SegmentUpdate { egress: *egress })
                .await?;
            print_one(out, fmt, &s, || segments_table(std::slice::from_ref(&s)))?;
        }
        SegmentCmd::Ingress {
            segment,
            tenant,
            allow,
        } => {
            let s = c
                .set_segment_ingress(
                    &tenant.tenant,
                    segment,
                    &SegmentIngress {
                        rules: allow.clone(),
                    },
                )
                .await?;
            print_one(out, fmt, &s, || segments_table(std::slice::from_ref(&s)))?;
        }
        SegmentCmd::Delete { segment, tenant } => {
            c.delete_segment(&tenant.tenant, segment).await?;
            if fmt == Format::Table {
                writeln!(out, "Deleted segment {segment}")?;
            }
        }
    }
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Create SIZE identical VMs NAME-0 … placed together, rail-aligned.
    Create {
        /// The cluster's name; its members are NAME-0, NAME-1, …
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// How many VMs.
        #[arg(long)]
        size: u32,
        /// Replace failed members without being asked (`kumo cluster
        /// repair`), once the cluster has been degraded --repair-delay.
        #[arg(long)]
        auto_repair: bool,
        /// How long a degraded cluster waits before it repairs itself
        /// (a host that is only rebooting comes back within it): 2m
        /// unless set.
        #[arg(long, value_parser = parse_duration, requires = "auto_repair")]
        repair_delay: Option<u64>,
        /// Keep N members' worth of room free in the cluster's scalable
        /// unit for repairs (charged at the spare_gpu rate; other tenants'
        /// spot VMs may use it until a repair needs it).
        #[arg(long, default_value_t = 0)]
        spares: u32,
        /// `required`: every member in one scalable unit or no cluster
        /// (repairs wait for room there); `preferred` (the default): one
        /// unit when one has room, else the fewest units.
        #[arg(long, value_parser = parse_single_su, default_value = "preferred")]
        single_su: kumo_api_types::SingleSu,
        #[command(flatten)]
        spec: Box<SpecArgs>,
    },
    /// Replace failed members (host lost, VM in error, a device
    /// quarantined) by new VMs of the same shape, names and addresses.
    Repair {
        /// The cluster's name.
        cluster: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// The cluster's events: health changes, repairs.
    Events {
        /// The cluster's name.
        cluster: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// The tenant's clusters.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Members, their hosts, scalable units and rails.
    Show {
        /// The cluster's name.
        cluster: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// The MPI hostfile (also at /etc/kumo/hostfile in every member).
    Hostfile {
        /// The cluster's name.
        cluster: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Delete a cluster and every member.
    Delete {
        /// The cluster's name.
        cluster: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

#[derive(Subcommand, Debug)]
pub enum VmCmd {
    /// Create a VM; with --wait, wait until it runs.
    Create {
        /// The VM's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        #[command(flatten)]
        spec: SpecArgs,
        /// Wait until the VM is running (or fails).
        #[arg(long)]
        wait: bool,
    },
    /// The tenant's VMs.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// One VM: its state, size, networks, public addresses, SSH command.
    Show {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Log in to a VM with ssh.
    ///
    /// ssh goes to the VM's public address (a floating address, else a
    /// port forward to port 22) as its template's default user: the
    /// command `kumo vm show` prints.
    Ssh {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// Log in as this user [default: the VM template's default user].
        #[arg(long, short = 'l')]
        user: Option<String>,
        /// Arguments for ssh after `--`, put after the destination: options
        /// such as -L 8888:localhost:8888, or a command to run.
        #[arg(last = true, value_name = "SSH_ARGS")]
        args: Vec<String>,
    },
    /// Start a stopped VM.
    Start {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// Wait until the VM is running (or fails).
        #[arg(long)]
        wait: bool,
    },
    /// Shut a VM down; `kumo vm start` starts it again.
    Stop {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// Wait until the VM has stopped.
        #[arg(long)]
        wait: bool,
    },
    /// Restart a running VM.
    Reboot {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// Wait until the VM is running again.
        #[arg(long)]
        wait: bool,
    },
    /// Shut a VM down and give back its GPUs and CPUs; its disks stay.
    ///
    /// Its GPUs, NICs, CPUs and memory go back to the pool; its root disk
    /// and volumes stay (charged for storage only).
    Shelve {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// Wait until the VM is shelved.
        #[arg(long)]
        wait: bool,
    },
    /// Move a VM off a host with a maintenance window now, as the window
    /// would: shelved, then placed on another host with its disks.
    Evacuate {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Bring a shelved VM back and start it.
    ///
    /// It is placed again on the host holding its disks (waiting as
    /// `pending` while that host has no room), or with --anywhere on any.
    Unshelve {
        /// The VM's name or id.
        vm: String,
        /// Place it on any host with room instead, moving its root disk
        /// and volumes there first (`scheduled` while they move).
        #[arg(long)]
        anywhere: bool,
        #[command(flatten)]
        tenant: TenantArg,
        /// Wait until the VM is running (or fails), disk moves included.
        #[arg(long)]
        wait: bool,
    },
    /// Delete a VM and its root disk; its volumes stay, detached.
    Delete {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// Wait until the VM is gone.
        #[arg(long)]
        wait: bool,
    },
    /// The NCCL topology file the guest gets.
    Topology {
        /// The VM's name or id.
        vm: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// The VM's serial console in this terminal (Ctrl-] leaves).
    ///
    /// Opening it to type takes it over from whoever typed before (they
    /// are told).
    Console {
        /// The VM's name or id.
        vm: String,
        /// Watch only (viewers may).
        #[arg(long)]
        read_only: bool,
        /// Print the console's scrollback (what it showed since boot, up
        /// to ~1 MiB), then leave.
        #[arg(long)]
        log: bool,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s).ok_or_else(|| "role must be owner, member or viewer".into())
}

pub fn parse_duration(s: &str) -> Result<u64, String> {
    let err = || format!("{s:?} is not a duration like 90d, 12h, 30m or 45s");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| err())?;
    let mul = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(err()),
    };
    if n == 0 {
        return Err("a duration must be positive".into());
    }
    n.checked_mul(mul).ok_or_else(err)
}

fn parse_gpu_limit(s: &str) -> Result<(String, u32), String> {
    let (model, n) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected MODEL=COUNT"))?;
    let n = n
        .parse()
        .map_err(|_| format!("{s:?}: COUNT must be a number"))?;
    Ok((model.to_owned(), n))
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
            let token = match token {
                Some(t) => t.clone(),
                None if *device => {
                    crate::device_login::run(server, provider.as_deref(), out).await?
                }
                None => crate::browser_login::run(server, *no_browser, out).await?,
            };
            let c = Client::new(server, Some(token.clone()))?;
            let me = c
                .me()
                .await
                .context("the server did not accept this token")?;
            let path = env.profile_path.clone().ok_or_else(|| {
                anyhow!("cannot find a config directory: set HOME or KUMO_CLI_CONFIG")
            })?;
            let mut profiles = env.profiles.clone();
            let name = cli.profile.clone().unwrap_or_else(|| "default".into());
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
        }
        Command::Tenant(cmd) => tenant(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Member(cmd) => member(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::User(cmd) => user(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Token(cmd) => token(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Quota(cmd) => quota(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Host(cmd) => host(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Template(cmd) => template(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Vm(cmd) => vm(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Cluster(cmd) => cluster(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Segment(cmd) => segment_cmd(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::PublicIp(cmd) => {
            crate::public_net::public_ip(cmd, &client(&cli, &env)?, fmt, out).await?
        }
        Command::Volume(cmd) => crate::volumes::volume(cmd, &client(&cli, &env)?, fmt, out).await?,
        Command::Share(cmd) => crate::shares::share(cmd, &client(&cli, &env)?, fmt, out).await?,
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
            let events = client(&cli, &env)?.events(&tenant.tenant, *limit).await?;
            print_one(out, fmt, &events, || {
                let mut t = Table::new(&["at", "vm", "event", "message"]);
                for e in &events {
                    t.row(vec![
                        e.at.format("%Y-%m-%d %H:%M:%S").to_string(),
                        e.vm_id.to_string(),
                        e.kind.clone(),
                        e.message.clone(),
                    ]);
                }
                t.render()
            })?;
        }
        Command::Audit { tenant, limit } => {
            let entries = client(&cli, &env)?.audit(tenant.as_deref(), *limit).await?;
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
        }
    }
    Ok(())
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

async fn tenant(
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

pub(crate) fn print_one<T: serde::Serialize>(
    out: &mut dyn Write,
    fmt: Format,
    value: &T,
    table: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match fmt {
        Format::Json => write!(out, "{}", json(value))?,
        Format::Table => write!(out, "{}", table())?,
    }
    Ok(())
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

async fn member(
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

async fn user(cmd: &UserCmd, c: &Client, fmt: Format, out: &mut dyn Write) -> anyhow::Result<()> {
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

async fn token(cmd: &TokenCmd, c: &Client, fmt: Format, out: &mut dyn Write) -> anyhow::Result<()> {
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

fn quota_table(q: &Quota) -> String {
    let mut t = Table::new(&["resource", "limit"]);
    for (model, n) in &q.gpus {
        t.row(vec![format!("gpus.{model}"), n.to_string()]);
    }
    for (model, n) in &q.guarantee {
        t.row(vec![format!("guarantee.{model}"), n.to_string()]);
    }
    for (name, v) in [
        ("vcpus", q.vcpus),
        ("memory_gib", q.memory_gib),
        ("vms", q.vms),
        ("disk_gib", q.disk_gib),
        ("segments", q.segments),
        ("roce_segments", q.roce_segments),
        ("public_ips", q.public_ips),
        ("volume_gib", q.volume_gib),
        ("share_gib", q.share_gib),
    ] {
        t.row(vec![name.into(), v.to_string()]);
    }
    t.render()
}

async fn quota(cmd: &QuotaCmd, c: &Client, fmt: Format, out: &mut dyn Write) -> anyhow::Result<()> {
    match cmd {
        QuotaCmd::Show { tenant } => {
            let q = c.quota(&tenant.tenant).await?;
            print_one(out, fmt, &q, || quota_table(&q))?;
        }
        QuotaCmd::Guarantees => {
            let list: Vec<kumo_api_types::GuaranteeStanding> = c.get("/api/v1/guarantees").await?;
            print_one(out, fmt, &list, || {
                let mut t = Table::new(&["model", "promised", "in service", "tenants"]);
                for g in &list {
                    let short = if g.promised > g.in_service {
                        " (OVERPROMISED)"
                    } else {
                        ""
                    };
                    t.row(vec![
                        g.model.clone(),
                        format!("{}{short}", g.promised),
                        g.in_service.to_string(),
                        g.tenants
                            .iter()
                            .map(|(t, n)| format!("{t}={n}"))
                            .collect::<Vec<_>>()
                            .join(" "),
                    ]);
                }
                t.render()
            })?;
        }
        QuotaCmd::Set {
            tenant,
            gpus,
            guarantee,
            vcpus,
            memory_gib,
            vms,
            disk_gib,
            segments,
            roce_segments,
            public_ips,
            volume_gib,
            share_gib,
        } => {
            let mut q = c.quota(&tenant.tenant).await?;
            let mut models: BTreeMap<String, u32> = q.gpus.clone();
            for (model, n) in gpus {
                if *n == 0 {
                    models.remove(model);
                } else {
                    models.insert(model.clone(), *n);
                }
            }
            q.gpus = models;
            for (model, n) in guarantee {
                if *n == 0 {
                    q.guarantee.remove(model);
                } else {
                    q.guarantee.insert(model.clone(), *n);
                }
            }
            for (slot, v) in [
                (&mut q.vcpus, vcpus),
                (&mut q.memory_gib, memory_gib),
                (&mut q.vms, vms),
                (&mut q.disk_gib, disk_gib),
                (&mut q.segments, segments),
                (&mut q.roce_segments, roce_segments),
                (&mut q.public_ips, public_ips),
                (&mut q.volume_gib, volume_gib),
                (&mut q.share_gib, share_gib),
            ] {
                if let Some(v) = v {
                    *slot = *v;
                }
            }
            if gpus.is_empty()
                && guarantee.is_empty()
                && [
                    vcpus,
                    memory_gib,
                    vms,
                    disk_gib,
                    segments,
                    roce_segments,
                    public_ips,
                    volume_gib,
                    share_gib,
                ]
                .iter()
                .all(|v| v.is_none())
            {
                bail!("nothing to set: give at least one of --gpus, --guarantee, --vcpus, --memory-gib, --vms, --disk-gib, --segments, --roce-segments, --public-ips, --volume-gib, --share-gib");
            }
            let q = c.set_quota(&tenant.tenant, &q).await?;
            print_one(out, fmt, &q, || quota_table(&q))?;
        }
    }
    Ok(())
}

async fn host(cmd: &HostCmd, c: &Client, fmt: Format, out: &mut dyn Write) -> anyhow::Result<()> {
    match cmd {
        HostCmd::List => {
            let hosts = c.list_hosts().await?;
            print_one(out, fmt, &hosts, || {
                let mut t = Table::new(&[
                    "name",
                    "state",
                    "gpus",
                    "free",
                    "models",
                    "nics",
                    "cpus",
                    "last heartbeat",
                ]);
                for h in &hosts {
                    t.row(vec![
                        h.name.clone(),
                        h.state.as_str().into(),
                        h.gpus.to_string(),
                        h.gpus_free.to_string(),
                        if h.gpu_models.is_empty() {
                            "-".into()
                        } else {
                            h.gpu_models.join(",")
                        },
                        h.rdma_nics.to_string(),
                        h.cpus.to_string(),
                        h.last_heartbeat_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                    ]);
                }
                t.render()
            })?;
        }
        HostCmd::Show { host } => {
            let h = c.host(host).await?;
            print_one(out, fmt, &h, || {
                let passthrough = if h.host.passthrough_ready {
                    format!(
                        "ready ({} GiB hugepages free)",
                        h.host.hugepages_free_bytes >> 30
                    )
                } else {
                    format!(
                        "NOT READY, CPU-only VMs only:\n        - {}",
                        h.host.passthrough_problems.join("\n        - ")
                    )
                };
                let mut nvswitch = String::new();
                if let Some(p) = &h.host.fabric_manager_problem {
                    nvswitch = format!("NVSwitch: {p}\n");
                } else if !h.host.partitions.is_empty() {
                    nvswitch = format!(
                        "NVSwitch partitions: {}\n",
                        h.host
                            .partitions
                            .iter()
                            .map(|p| format!("{}={}", p.id, p.gpus.len()))
                            .collect::<Vec<_>>()
                            .join(" ")
                    );
                }
                format!(
                    "Name:   {}\nState:  {}\nGPUs:   {} ({} free) {}\nCPUs:   {}\nVirt:   {}\nPassthrough: {}\n{nvswitch}\n{}\nAllocations: {}\n",
                    h.host.name,
                    h.host.state.as_str(),
                    h.host.gpus,
                    h.host.gpus_free,
                    h.host.gpu_models.join(","),
                    h.host.cpus,
                    h.host.virt_type,
                    passthrough,
                    h.matrix,
                    h.allocations.len()
                )
            })?;
        }
        HostCmd::Maintenance {
            host,
            at,
            reason,
            done,
        } => {
            let h = match at {
                Some(at) if !*done => {
                    c.schedule_maintenance(
                        host,
                        &kumo_api_types::MaintenanceCreate {
                            at: *at,
                            reason: reason.clone(),
                        },
                    )
                    .await?
                }
                _ => c.end_maintenance(host).await?,
            };
            print_one(out, fmt, &h, || match &h.maintenance {
                Some(w) => format!(
                    "{}: {}, maintenance at {}\n",
                    h.name,
                    h.state.as_str(),
                    w.at.to_rfc3339()
                ),
                None => format!("{}: {}\n", h.name, h.state.as_str()),
            })?;
        }
        HostCmd::Drain { host } | HostCmd::Undrain { host } => {
            let action = if matches!(cmd, HostCmd::Drain { .. }) {
                "drain"
            } else {
                "undrain"
            };
            let h = c.host_action(host, action).await?;
            print_one(out, fmt, &h, || {
                format!("{}: {}\n", h.name, h.state.as_str())
            })?;
        }
        HostCmd::JoinToken(JoinTokenCmd::Create {
            description,
            ttl,
            uses,
        }) => {
            let t = c
                .create_join_token(&JoinTokenCreate {
                    description: description.clone(),
                    ttl_seconds: *ttl,
                    uses: *uses,
                })
                .await?;
            print_one(out, fmt, &t, || {
                format!(
                    "Join token {} for {} host(s) (expires {}). It is shown only once:\n{}\n",
                    t.id, t.uses, t.expires_at, t.token
                )
            })?;
        }
        HostCmd::JoinToken(JoinTokenCmd::List) => {
            let ts = c.list_join_tokens().await?;
            print_one(out, fmt, &ts, || {
                let mut t = Table::new(&["id", "description", "expires", "used", "revoked"]);
                for x in &ts {
                    t.row(vec![
                        x.id.to_string(),
                        x.description.clone(),
                        x.expires_at.format("%Y-%m-%d %H:%M").to_string(),
                        format!("{}/{}", x.used, x.uses),
                        opt(&x.revoked_at.map(|e| e.format("%Y-%m-%d %H:%M").to_string())),
                    ]);
                }
                t.render()
            })?;
        }
        HostCmd::JoinToken(JoinTokenCmd::Revoke { id }) => {
            c.revoke_join_token(id).await?;
            if fmt == Format::Table {
                writeln!(out, "Revoked join token {id}")?;
            }
        }
        HostCmd::Device(DeviceCmd::List { host, state }) => {
            let state = match state {
                Some(s) => Some(kumo_api_types::DeviceState::parse(s).ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown state {s:?}: healthy, suspect, quarantined, repairing or validating"
                    )
                })?),
                None => None,
            };
            let list = c
                .devices(&kumo_api_types::DeviceQuery {
                    host: host.clone(),
                    state,
                })
                .await?;
            print_one(out, fmt, &list, || {
                let mut t = Table::new(&["host", "device", "kind", "state", "since", "vms", "why"]);
                for d in &list.items {
                    t.row(vec![
                        d.host.clone(),
                        d.bdf.clone(),
                        d.kind.clone(),
                        d.state.as_str().into(),
                        d.since.format("%Y-%m-%d %H:%M").to_string(),
                        d.vms.len().to_string(),
                        opt(&d.reason),
                    ]);
                }
                let counts: Vec<String> = list
                    .counts
                    .iter()
                    .map(|(s, n)| format!("{n} {s}"))
                    .collect();
                format!(
                    "{}\nFleet: {} (Kumo quarantines at most {} by itself)\n",
                    t.render().trim_end(),
                    if counts.is_empty() {
                        "no device reported yet".into()
                    } else {
                        counts.join(", ")
                    },
                    list.quarantine_cap
                )
            })?;
        }
        HostCmd::Device(
            DeviceCmd::Quarantine { host, bdf, reason }
            | DeviceCmd::Repair { host, bdf, reason }
            | DeviceCmd::Validate { host, bdf, reason },
        ) => {
            let action = match cmd {
                HostCmd::Device(DeviceCmd::Quarantine { .. }) => "quarantine",
                HostCmd::Device(DeviceCmd::Repair { .. }) => "repair",
                _ => "validate",
            };
            let d = c.device_action(host, bdf, action, reason.clone()).await?;
            print_one(out, fmt, &d, || {
                format!(
                    "{} {}: {} ({})\n",
                    d.host,
                    d.bdf,
                    d.state.as_str(),
                    opt(&d.reason)
                )
            })?;
        }
        HostCmd::Rejoin { host } => {
            c.rejoin_host(host).await?;
            if fmt == Format::Table {
                writeln!(out, "{host} may join again; its old credential is revoked")?;
            }
        }
    }
    Ok(())
}

async fn template(
    cmd: &TemplateCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let table = |ts: &[kumo_api_types::Template]| {
        let mut t = Table::new(&["name", "os", "user", "image"]);
        for x in ts {
            t.row(vec![
                x.name.clone(),
                x.os.clone(),
                x.default_user.clone(),
                x.image_path.clone().unwrap_or_default(),
            ]);
        }
        t.render()
    };
    match cmd {
        TemplateCmd::Create {
            name,
            image,
            os,
            default_user,
            kernel,
            initrd,
            cmdline,
        } => {
            let t = c
                .create_template(&TemplateCreate {
                    name: name.clone(),
                    image_path: image.clone(),
                    os: os.clone(),
                    default_user: default_user.clone(),
                    kernel_path: kernel.clone(),
                    initrd_path: initrd.clone(),
                    kernel_cmdline: cmdline.clone(),
                })
                .await?;
            print_one(out, fmt, &t, || table(std::slice::from_ref(&t)))?;
        }
        TemplateCmd::List => {
            let ts = c.list_templates().await?;
            print_one(out, fmt, &ts, || table(&ts))?;
        }
    }
    Ok(())
}

fn vms_table(vms: &[Vm]) -> String {
    let mut t = Table::new(&["name", "state", "gpus", "vcpus", "memory", "host"]);
    for v in vms {
        t.row(vec![
            v.name.clone(),
            v.state.as_str().into(),
            // Borrowed GPUs (above the project's guaranteed share) may be
            // reclaimed: said where the count is.
            if v.borrowed_since.is_some() {
                format!("{} (borrowed)", v.spec.gpus)
            } else {
                v.spec.gpus.to_string()
            },
            v.spec.vcpus.to_string(),
            format!("{} GiB", v.spec.memory_gib),
            opt(&v.host),
        ]);
    }
    t.render()
}

fn vm_detail(v: &Vm, user: Option<&str>) -> String {
    let mut s = format!(
        "Name:    {}\nTenant:  {}\nState:   {}{}\nHost:    {}\nSize:    {} GPU(s), {} vCPUs, {} GiB memory, {} GiB disk\n",
        v.name,
        v.tenant,
        v.state.as_str(),
        v.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(),
        opt(&v.host),
        v.spec.gpus,
        v.spec.vcpus,
        v.spec.memory_gib,
        v.spec.disk_gib,
    );
    for e in &v.scheduled_events {
        if e.action == kumo_api_types::ScheduledAction::Reclaimable {
            s.push_str(&format!(
                "Borrowed: since {}: above the project's guaranteed share; it may be reclaimed, with notice, for a project within its own\n",
                e.at.to_rfc3339()
            ));
            continue;
        }
        s.push_str(&format!(
            "Scheduled: {} at {}: {}{}\n",
            e.kind,
            e.at.to_rfc3339(),
            match e.action {
                kumo_api_types::ScheduledAction::Evacuate => {
                    "moved to another host with its disks (kumo vm evacuate does it now)"
                }
                kumo_api_types::ScheduledAction::Replace => {
                    "replaced on another host (same name and address, fresh root disk)"
                }
                kumo_api_types::ScheduledAction::Stop
                | kumo_api_types::ScheduledAction::Reclaimable => "stopped",
            },
            e.reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default(),
        ));
    }
    if let Some(p) = &v.placement {
        let mut t = Table::new(&["gpu (host)", "gpu (guest)", "model", "nic", "nic (guest)"]);
        for g in &p.gpus {
            t.row(vec![
                g.host_bdf.clone(),
                g.guest_bdf.clone(),
                g.model.clone(),
                opt(&g.nic),
                opt(&g.nic_guest_bdf),
            ]);
        }
        let mut n = Table::new(&["guest numa", "host numa", "vcpus", "host cpus", "memory"]);
        for c in &p.numa {
            n.row(vec![
                c.guest_node.to_string(),
                c.host_node.to_string(),
                c.vcpus.clone(),
                c.host_cpus.clone(),
                format!("{} MiB", c.memory_mib),
            ]);
        }
        s.push_str(&format!("Boot: {}\n", p.boot_line()));
        if !p.gpus.is_empty() {
            s.push('\n');
            s.push_str(&t.render());
        }
        s.push('\n');
        s.push_str(&n.render());
    }
    s.push('\n');
    if v.networks.is_empty() {
        s.push_str("Networks: none\n");
    } else {
        let mut t = Table::new(&["segment", "address", "mac", "public", "forwards"]);
        for n in &v.networks {
            t.row(vec![
                n.segment.clone(),
                n.ip.clone(),
                n.mac.clone(),
                opt(&n.public_ip),
                if n.forwards.is_empty() {
                    "-".into()
                } else {
                    n.forwards
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            ]);
        }
        s.push_str(&t.render());
    }
    // Every way in from outside: floating addresses, then forwards.
    let mut public: Vec<String> = v
        .networks
        .iter()
        .filter_map(|n| {
            n.public_ip
                .as_ref()
                .map(|ip| format!("{ip} (floating, to {} on {})", n.ip, n.segment))
        })
        .collect();
    public.extend(v.networks.iter().flat_map(|n| {
        n.forwards
            .iter()
            .map(move |f| format!("{f} (forward, to {} on {})", n.ip, n.segment))
    }));
    if public.is_empty() {
        s.push_str("Public:  none\n");
    } else {
        s.push_str(&format!("Public:  {}\n", public.join("\n         ")));
    }
    match crate::ssh::target(&v.networks, user) {
        Some(t) => s.push_str(&format!("SSH:     {t}\n")),
        None => s.push_str(&format!(
            "SSH:     no public address; {}\n",
            crate::ssh::no_address_hint(&v.name, &v.tenant, !v.networks.is_empty())
        )),
    }
    s
}

/// The login user of a VM's template, for SSH.
async fn template_user(c: &Client, v: &Vm) -> anyhow::Result<Option<String>> {
    let Some(name) = &v.spec.template else {
        return Ok(None);
    };
    Ok(c.list_templates()
        .await
        .context("looking up the VM template's user")?
        .into_iter()
        .find(|t| &t.name == name)
        .map(|t| t.default_user))
}

/// What a `--wait` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    Running,
    Stopped,
    Shelved,
    Gone,
}

impl Until {
    fn reached(self, s: VmState) -> bool {
        match self {
            Until::Running => s == VmState::Running,
            Until::Stopped => s == VmState::Stopped,
            Until::Shelved => s == VmState::Shelved,
            Until::Gone => s == VmState::Deleted,
        }
    }

    fn what(self, vm: &str) -> String {
        match self {
            Until::Running => format!("waiting for {vm} to run"),
            Until::Stopped => format!("waiting for {vm} to stop"),
            Until::Shelved => format!("waiting for {vm} to be shelved"),
            Until::Gone => format!("waiting for {vm} to be deleted"),
        }
    }
}

/// Polls a VM until it is where `until` says (`None`: gone), showing its
/// state on a terminal; fails if it goes into `error` or `limit` passes.
async fn wait_vm(
    c: &Client,
    tenant: &str,
    mut v: Vm,
    until: Until,
    limit: std::time::Duration,
) -> anyhow::Result<Option<Vm>> {
    let progress = crate::progress::Progress::start(until.what(&v.name));
    let start = std::time::Instant::now();
    let id = v.id.to_string();
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        if until.reached(v.state) {
            return Ok((until != Until::Gone).then_some(v));
        }
        if v.state == VmState::Error && until != Until::Gone {
            return Err(crate::hints::Hinted::error(
                format!(
                    "{} failed: {}",
                    v.name,
                    v.reason.as_deref().unwrap_or("no reason given")
                ),
                format!("see what happened: kumo events --tenant {tenant}"),
            ));
        }
        if start.elapsed() > limit {
            return Err(crate::hints::Hinted::error(
                format!(
                    "{} is still {} after {} minutes",
                    v.name,
                    v.state.as_str(),
                    limit.as_secs() / 60
                ),
                format!(
                    "it may get there yet: kumo vm show {} --tenant {tenant}",
                    v.name
                ),
            ));
        }
        progress.set(&match &v.reason {
            Some(r) => format!("{} ({r})", v.state.as_str()),
            None => v.state.as_str().to_owned(),
        });
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(1));
        v = match c.vm(tenant, &id).await {
            Ok(v) => v,
            Err(e) if until == Until::Gone && e.status() == Some(404) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
    }
}

const TEN_MINUTES: std::time::Duration = std::time::Duration::from_secs(600);

/// Runs ssh with `args`, in place of this process where it can (its exit
/// code is then kumo's). Only the Unix path is built and tested: the CLI is
/// shipped for Linux.
fn exec_ssh(args: &[String]) -> anyhow::Result<()> {
    let mut cmd = std::process::Command::new("ssh");
    cmd.args(args);
    let cannot = |e: std::io::Error| {
        crate::hints::Hinted::error(
            format!("cannot run ssh: {e}"),
            "install an OpenSSH client (ssh on PATH), or run the SSH line of kumo vm show yourself",
        )
    };
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // Only returns if ssh could not be run.
        Err(cannot(cmd.exec()))
    }
    #[cfg(not(unix))]
    {
        let status = cmd.status().map_err(cannot)?;
        std::process::exit(status.code().unwrap_or(255));
    }
}

async fn vm(cmd: &VmCmd, c: &Client, fmt: Format, out: &mut dyn Write) -> anyhow::Result<()> {
    match cmd {
        VmCmd::Create {
            name,
            tenant,
            spec,
            wait,
        } => {
            let mut v = c.create_vm(&tenant.tenant, &spec.vm(name)?).await?;
            if *wait {
                if let Some(w) =
                    wait_vm(c, &tenant.tenant, v.clone(), Until::Running, TEN_MINUTES).await?
                {
                    v = w;
                }
            }
            let user = if fmt == Format::Table {
                template_user(c, &v).await?
            } else {
                None
            };
            print_one(out, fmt, &v, || vm_detail(&v, user.as_deref()))?;
        }
        VmCmd::List { tenant } => {
            let vms = c.list_vms(&tenant.tenant).await?;
            print_one(out, fmt, &vms, || vms_table(&vms))?;
        }
        VmCmd::Show { vm, tenant } => {
            let v = c.vm(&tenant.tenant, vm).await?;
            let user = if fmt == Format::Table {
                template_user(c, &v).await?
            } else {
                None
            };
            print_one(out, fmt, &v, || vm_detail(&v, user.as_deref()))?;
        }
        VmCmd::Ssh {
            vm,
            tenant,
            user,
            args,
        } => {
            let v = c.vm(&tenant.tenant, vm).await?;
            let user = match user {
                Some(u) => Some(u.clone()),
                None => template_user(c, &v).await?,
            };
            let Some(target) = crate::ssh::target(&v.networks, user.as_deref()) else {
                return Err(crate::hints::Hinted::error(
                    format!("{} has no public address to reach it at", v.name),
                    crate::ssh::no_address_hint(&v.name, &tenant.tenant, !v.networks.is_empty()),
                ));
            };
            if v.state != VmState::Running {
                eprintln!("kumo: note: {} is {}", v.name, v.state.as_str());
            }
            let mut all = target.args();
            all.extend(args.iter().cloned());
            out.flush()?;
            exec_ssh(&all)?;
        }
        VmCmd::Start { vm, tenant, wait }
        | VmCmd::Stop { vm, tenant, wait }
        | VmCmd::Reboot { vm, tenant, wait }
        | VmCmd::Shelve { vm, tenant, wait } => {
            let (action, until) = match cmd {
                VmCmd::Start { .. } => ("start", Until::Running),
                VmCmd::Stop { .. } => ("stop", Until::Stopped),
                VmCmd::Shelve { .. } => ("shelve", Until::Shelved),
                _ => ("reboot", Until::Running),
            };
            let mut v = c.vm_action(&tenant.tenant, vm, action).await?;
            if *wait {
                if let Some(w) = wait_vm(c, &tenant.tenant, v.clone(), until, TEN_MINUTES).await? {
                    v = w;
                }
            }
            print_one(out, fmt, &v, || {
                format!("{} {}: {}\n", action, v.name, v.state.as_str())
            })?;
        }
        VmCmd::Evacuate { vm, tenant } => {
            let v = c.vm_action(&tenant.tenant, vm, "evacuate").await?;
            print_one(out, fmt, &v, || {
                format!(
                    "evacuate {}: {} (placed on another host once shelved)\n",
                    v.name,
                    v.state.as_str()
                )
            })?;
        }
        VmCmd::Unshelve {
            vm,
            anywhere,
            tenant,
            wait,
        } => {
            let mut v = c.unshelve_vm(&tenant.tenant, vm, *anywhere).await?;
            if *wait {
                // Moving disks to another host takes a while.
                let limit = TEN_MINUTES * 6;
                if let Some(w) =
                    wait_vm(c, &tenant.tenant, v.clone(), Until::Running, limit).await?
                {
                    v = w;
                }
            }
            let action = "unshelve";
            print_one(out, fmt, &v, || {
                format!("{} {}: {}\n", action, v.name, v.state.as_str())
            })?;
        }
        VmCmd::Delete { vm, tenant, wait } => {
            let v = c.delete_vm(&tenant.tenant, vm).await?;
            if *wait {
                wait_vm(c, &tenant.tenant, v.clone(), Until::Gone, TEN_MINUTES).await?;
                print_one(out, fmt, &v, || format!("Deleted {}\n", v.name))?;
            } else {
                print_one(out, fmt, &v, || format!("Deleting {}\n", v.name))?;
            }
        }
        VmCmd::Topology { vm, tenant } => {
            write!(out, "{}", c.vm_nccl_topology(&tenant.tenant, vm).await?)?;
        }
        VmCmd::Console {
            vm,
            read_only,
            log,
            tenant,
        } => {
            let why = crate::console::run(c, &tenant.tenant, vm, *read_only, *log).await?;
            if !*log {
                eprintln!("\r\n[kumo: console closed: {why}]");
            }
        }
    }
    Ok(())
}

fn cluster_detail(cl: &Cluster) -> String {
    let mut s = format!(
        "Name:    {}\nTenant:  {}\nState:   {}\nSize:    {} × ({} GPU(s), {} vCPUs, {} GiB memory)\nHealth:  {}{}\nRepair:  {}\n",
        cl.name,
        cl.tenant,
        cl.state,
        cl.size,
        cl.spec.gpus,
        cl.spec.vcpus,
        cl.spec.memory_gib,
        cl.health.as_str(),
        cl.health_since
            .map(|t| format!(" since {}", t.to_rfc3339()))
            .unwrap_or_default(),
        if cl.auto_repair {
            format!("by itself after {} s degraded", cl.repair_delay_seconds)
        } else {
            "by hand (kumo cluster repair)".to_owned()
        },
    );
    for p in &cl.problems {
        s.push_str(&format!("  {}: {}\n", p.member, p.detail));
    }
    if cl.single_su == kumo_api_types::SingleSu::Required {
        s.push_str("Units:   one scalable unit required\n");
    }
    if cl.spares > 0 {
        s.push_str(&format!(
            "Spares:  {} kept in {} ({} with room now)\n",
            cl.spares,
            cl.spare_unit.as_deref().unwrap_or("hosts without a unit"),
            cl.spares_ready
        ));
    }
    s.push('\n');
    let mut t = Table::new(&["member", "state", "host", "su", "rails"]);
    for m in &cl.members {
        let rails: Vec<String> = m
            .rails
            .iter()
            .map(|r| r.map(|r| r.to_string()).unwrap_or_else(|| "-".into()))
            .collect();
        t.row(vec![
            m.name.clone(),
            m.state.as_str().into(),
            opt(&m.host),
            opt(&m.scalable_unit),
            if rails.is_empty() {
                "-".into()
            } else {
                rails.join(",")
            },
        ]);
    }
    s.push_str(&t.render());
    s
}

async fn cluster(
    cmd: &ClusterCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        ClusterCmd::Create {
            name,
            tenant,
            size,
            auto_repair,
            repair_delay,
            spares,
            single_su,
            spec,
        } => {
            let v = spec.vm(name)?;
            if v.networks.iter().any(|n| n.ip.is_some()) {
                anyhow::bail!(
                    "cluster members get their addresses from the segment: --network SEGMENT"
                );
            }
            if !v.volumes.is_empty() {
                anyhow::bail!("a volume is one VM's disk: attach volumes to VMs, not to clusters");
            }
            if v.on_reclaim.is_some() {
                anyhow::bail!("--on-reclaim is for single spot VMs");
            }
            let cl = c
                .create_cluster(
                    &tenant.tenant,
                    &ClusterCreate {
                        name: v.name,
                        size: *size,
                        gpus: v.gpus,
                        gpu_model: v.gpu_model,
                        vcpus: v.vcpus,
                        memory_gib: v.memory_gib,
                        disk_gib: v.disk_gib,
                        template: v.template,
                        service_level: v.service_level,
                        ssh_keys: v.ssh_keys,
                        networks: v.networks.into_iter().map(|n| n.segment).collect(),
                        shares: v.shares,
                        auto_repair: *auto_repair,
                        repair_delay_seconds: repair_delay
                            .map(|d| u32::try_from(d).unwrap_or(u32::MAX)),
                        spares: *spares,
                        single_su: *single_su,
                    },
                )
                .await?;
            print_one(out, fmt, &cl, || cluster_detail(&cl))?;
        }
        ClusterCmd::List { tenant } => {
            let cls = c.list_clusters(&tenant.tenant).await?;
            print_one(out, fmt, &cls, || {
                let mut t = Table::new(&[
                    "name",
                    "state",
                    "health",
                    "size",
                    "gpus each",
                    "scalable units",
                ]);
                for cl in &cls {
                    let mut sus: Vec<String> = cl
                        .members
                        .iter()
                        .filter_map(|m| m.scalable_unit.clone())
                        .collect();
                    sus.sort();
                    sus.dedup();
                    t.row(vec![
                        cl.name.clone(),
                        cl.state.clone(),
                        cl.health.as_str().into(),
                        cl.size.to_string(),
                        cl.spec.gpus.to_string(),
                        if sus.is_empty() {
                            "-".into()
                        } else {
                            sus.join(",")
                        },
                    ]);
                }
                t.render()
            })?;
        }
        ClusterCmd::Show { cluster, tenant } => {
            let cl = c.cluster(&tenant.tenant, cluster).await?;
            print_one(out, fmt, &cl, || cluster_detail(&cl))?;
        }
        ClusterCmd::Repair { cluster, tenant } => {
            let r = c.repair_cluster(&tenant.tenant, cluster).await?;
            print_one(out, fmt, &r, || {
                let mut s = if r.replaced.is_empty() {
                    format!("Nothing to replace in {}\n", r.cluster.name)
                } else {
                    format!(
                        "Replacing {} of {}: same names and addresses, fresh root disks\n",
                        r.replaced.join(", "),
                        r.cluster.name
                    )
                };
                for p in &r.left {
                    s.push_str(&format!("Left alone: {}: {}\n", p.member, p.detail));
                }
                s
            })?;
        }
        ClusterCmd::Events { cluster, tenant } => {
            let evs = c.cluster_events(&tenant.tenant, cluster).await?;
            print_one(out, fmt, &evs, || {
                let mut t = Table::new(&["at", "kind", "message"]);
                for e in &evs {
                    t.row(vec![e.at.to_rfc3339(), e.kind.clone(), e.message.clone()]);
                }
                t.render()
            })?;
        }
        ClusterCmd::Hostfile { cluster, tenant } => {
            write!(
                out,
                "{}",
                c.cluster(&tenant.tenant, cluster).await?.hostfile
            )?;
        }
        ClusterCmd::Delete { cluster, tenant } => {
            let cl = c.delete_cluster(&tenant.tenant, cluster).await?;
            print_one(out, fmt, &cl, || {
                format!("Deleting {} ({} members)\n", cl.name, cl.members.len())
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90d"), Ok(90 * 86_400));
        assert_eq!(parse_duration("12h"), Ok(43_200));
        assert!(parse_duration("12").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("0d").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn gpu_limits_parse() {
        assert_eq!(parse_gpu_limit("H100=8"), Ok(("H100".into(), 8)));
        assert!(parse_gpu_limit("H100").is_err());
        assert!(parse_gpu_limit("H100=x").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
