//! `kumo vm` and `kumo events`: virtual machines from creation to deletion,
//! waiting for them with `--wait`, reaching them with ssh and the serial
//! console, and a tenant's VM events.

use std::io::Write;

use anyhow::Context;
use clap::Subcommand;
use kumo_api_types::{NetworkRequest, SegmentKind, Vm, VmCreate, VmState, DEFAULT_SEGMENT};

use crate::args::{SpecArgs, TenantArg};
use crate::client::Client;
use crate::output::{opt, print_one, Format, Table};

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
        /// A public address with it: a floating address attached to its
        /// first Ethernet NIC, and SSH (TCP 22) opened on that segment —
        /// from nothing to `kumo vm ssh` in one command.
        #[arg(long)]
        public_ip: bool,
        /// No NIC at all. Without --network the VM goes on the project's
        /// `default` segment, when it has one.
        #[arg(long, conflicts_with_all = ["network", "public_ip"])]
        no_network: bool,
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

fn vms_table(vms: &[Vm]) -> String {
    let mut t = Table::new(&["name", "state", "gpus", "vcpus", "memory", "host"]);
    for v in vms {
        t.row(vec![
            v.name.clone(),
            match &v.queue {
                Some(q) => format!("{} (#{})", v.state.as_str(), q.position),
                None => v.state.as_str().into(),
            },
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
    if let Some(q) = &v.queue {
        s.push_str(&crate::output::queue_lines(q));
    }
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

/// What a create given no `--network` asks for: a NIC on the project's
/// default segment (an Ethernet one named `default`, made with the
/// project where the platform does so) when it has one, said on stderr;
/// else none.
pub(crate) async fn on_default_segment(
    c: &Client,
    tenant: &str,
) -> anyhow::Result<Vec<NetworkRequest>> {
    let segment = match c.segment(tenant, DEFAULT_SEGMENT).await {
        Ok(s) if s.kind == SegmentKind::Ethernet => s.name,
        Ok(_) => return Ok(Vec::new()),
        Err(e) if e.status() == Some(404) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    eprintln!(
        "kumo: on the project's segment {segment:?} (--network names others; --no-network, none)"
    );
    Ok(vec![NetworkRequest { segment, ip: None }])
}

pub async fn vm(cmd: &VmCmd, c: &Client, fmt: Format, out: &mut dyn Write) -> anyhow::Result<()> {
    match cmd {
        VmCmd::Create {
            name,
            tenant,
            spec,
            public_ip,
            no_network,
            wait,
        } => {
            let mut body = VmCreate {
                public_ip: *public_ip,
                ..spec.vm(name)?
            };
            if body.networks.is_empty() && !*no_network {
                body.networks = on_default_segment(c, &tenant.tenant).await?;
            }
            let mut v = c.create_vm(&tenant.tenant, &body).await?;
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

/// `kumo events`: the lifecycle events of a tenant's VMs, newest first.
pub async fn events(
    c: &Client,
    tenant: &str,
    limit: u32,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let events = c.events(tenant, limit).await?;
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
    Ok(())
}
